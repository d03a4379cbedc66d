"""A small clusterui server for the client's tests: a real WebSocket server on
127.0.0.1 that checks the bearer token, answers hello with welcome (and a node token
after a join) and config, and acks events. Tests steer it through its attributes and
read what it received in `connections`."""

import asyncio
import http
import itertools
import json

from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed


class Connection:
    def __init__(self, ws, authorization):
        self.ws = ws
        self.authorization = authorization  # the Authorization header, as sent
        self.frames = []  # every frame received, parsed
        self.welcomed = False
        self.close_code = None  # once closed

    def of_type(self, frame_type):
        return [frame for frame in self.frames if frame["type"] == frame_type]


class FakeServer:
    def __init__(self, join_tokens=("join-1",), tls=None):
        self.tls = tls  # an ssl.SSLContext with the server's certificate: wss://localhost
        self.join_tokens = set(join_tokens)
        self.node_tokens = set()
        self.refuse_with = "close"  # a bad token: "close" (4401) or "http" (403)
        self.ack_events = True
        self.refuse_events = False  # answer events with an error frame naming the id
        self.server_errors = 0  # answer this many events with server_error and retry_id
        self.hello_errors = []  # answer the first hellos with error frames of these codes
        self.retry_after_s = None  # sent with them, when set
        self.welcome_interval_s = None  # sample_interval_s in welcome, when set
        self.startup_scripts = []
        self.after_welcome = []  # frames sent after welcome and config
        self.on_welcome = None  # async fn(connection), run after welcome
        self.connections = []
        self.attempts = []  # Authorization headers of every handshake, refused ones too
        self._tasks = set()
        self._new_tokens = (f"node-token-{n}" for n in itertools.count(1))

    async def __aenter__(self):
        self._server = await serve(
            self._handle, "127.0.0.1", 0, process_request=self._check_token, ssl=self.tls
        ).__aenter__()
        port = self._server.sockets[0].getsockname()[1]
        self.url = (f"wss://localhost:{port}/ws/agent/" if self.tls
                    else f"ws://127.0.0.1:{port}/ws/agent/")
        return self

    async def __aexit__(self, *exc_info):
        await self._server.__aexit__(*exc_info)

    def _valid(self, authorization):
        token = (authorization or "").removeprefix("Bearer ")
        return token in self.join_tokens or token in self.node_tokens

    def _check_token(self, connection, request):
        authorization = request.headers.get("Authorization")
        self.attempts.append(authorization)
        if self.refuse_with == "http" and not self._valid(authorization):
            return connection.respond(http.HTTPStatus.FORBIDDEN, "bad token\n")
        return None

    async def _handle(self, ws):
        authorization = ws.request.headers.get("Authorization")
        connection = Connection(ws, authorization)
        self.connections.append(connection)
        if not self._valid(authorization):
            await ws.close(4401, "bad token")
            return
        try:
            await self._read(ws, connection, authorization)
        except ConnectionClosed:
            pass
        connection.close_code = ws.close_code

    async def _read(self, ws, connection, authorization):
        async for message in ws:
            frame = json.loads(message)
            connection.frames.append(frame)
            if frame["type"] == "hello" and self.hello_errors:
                error = {"type": "error", "code": self.hello_errors.pop(0),
                         "message": "the hello was not handled"}
                if self.retry_after_s is not None:
                    error["retry_after_s"] = self.retry_after_s
                await ws.send(json.dumps(error))
            elif frame["type"] == "hello":
                await self._welcome(ws, connection, authorization)
            elif frame["type"] == "event" and self.refuse_events:
                await ws.send(
                    json.dumps(
                        {
                            "type": "error",
                            "code": "bad_message",
                            "message": "event.detail: not accepted",
                            "id": frame["id"],
                        }
                    )
                )
            elif frame["type"] == "event" and self.server_errors:
                self.server_errors -= 1
                error = {"type": "error", "code": "server_error",
                         "message": "the event was not stored", "retry_id": frame["id"]}
                if self.retry_after_s is not None:
                    error["retry_after_s"] = self.retry_after_s
                await ws.send(json.dumps(error))
            elif frame["type"] == "event" and self.ack_events:
                await ws.send(json.dumps({"type": "ack", "ids": [frame["id"]]}))

    async def _welcome(self, ws, connection, authorization):
        welcome = {"type": "welcome", "node_id": 17}
        if authorization.removeprefix("Bearer ") in self.join_tokens:
            node_token = next(self._new_tokens)
            self.node_tokens.add(node_token)
            welcome["node_token"] = node_token
        if self.welcome_interval_s is not None:
            welcome["sample_interval_s"] = self.welcome_interval_s
        await ws.send(json.dumps(welcome))
        await ws.send(json.dumps({"type": "config", "startup_scripts": self.startup_scripts}))
        connection.welcomed = True
        for frame in self.after_welcome:
            await ws.send(frame if isinstance(frame, str) else json.dumps(frame))
        if self.on_welcome is not None:
            # A task of its own, so the handler goes on reading frames meanwhile.
            self._tasks.add(asyncio.create_task(self.on_welcome(connection)))


async def until(predicate, timeout_s=5.0):
    """Wait until predicate() is true; fail the test if it does not become so in time."""
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.01)
