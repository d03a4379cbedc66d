"""The conformance tests against the agent gateway process's server (gateway/server.py): it
serves on a loopback port in the test's event loop, and GatewayCommunicator talks to it over
a real socket with the methods of Channels' WebsocketCommunicator that the tests use."""

import asyncio
from contextlib import asynccontextmanager

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from gateway.server import run_gateway


@asynccontextmanager
async def serving_gateway():
    """The gateway on a free loopback port: yields its agent URL."""
    stop, bound = asyncio.Event(), asyncio.get_running_loop().create_future()
    server = asyncio.ensure_future(run_gateway("127.0.0.1", 0, ready=bound.set_result,
                                               stop=stop))
    try:
        port = await asyncio.wait_for(bound, 10)
        yield f"ws://127.0.0.1:{port}/ws/agent/"
    finally:
        stop.set()
        await asyncio.wait_for(server, 10)


class GatewayCommunicator:
    def __init__(self, url, headers=()):
        self.url = url
        self.headers = {name.decode(): value.decode() for name, value in headers}
        self.ws = None
        self.read_ahead = []  # what receive_nothing() read

    async def connect(self, timeout=5):
        self.ws = await connect(self.url, additional_headers=self.headers, open_timeout=timeout,
                                compression=None, max_size=None)
        return True, None

    async def send_to(self, text_data=None, bytes_data=None):
        try:
            await self.ws.send(text_data if text_data is not None else bytes_data)
        except ConnectionClosed:
            pass  # as WebsocketCommunicator: the close is read with receive_output()

    async def _next(self, timeout):
        """The next thing the server did, as the ASGI message WebsocketCommunicator returns."""
        if self.read_ahead:
            return self.read_ahead.pop(0)
        try:
            data = await asyncio.wait_for(self.ws.recv(), timeout)
        except ConnectionClosed as exc:
            return {"type": "websocket.close",
                    "code": exc.rcvd.code if exc.rcvd is not None else 1006}
        key = "text" if isinstance(data, str) else "bytes"
        return {"type": "websocket.send", key: data}

    async def receive_output(self, timeout=1):
        return await self._next(timeout)

    async def receive_from(self, timeout=1):
        message = await self._next(timeout)
        assert message["type"] == "websocket.send", message
        return message.get("text", message.get("bytes"))

    async def receive_nothing(self, timeout=0.1, interval=0.01):
        if self.read_ahead:
            return False
        try:
            self.read_ahead.append(await self._next(timeout))
        except TimeoutError:
            return True
        return False

    async def disconnect(self, code=1000, timeout=1):
        await self.ws.close(code)
