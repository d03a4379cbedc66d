"""The agent gateway: `/ws/agent/` served by the websockets library, for large fleets.

    python manage.py agent_gateway --bind 0.0.0.0 --port 8001

It runs the agent socket's own code, AgentConsumer (gateway/consumers.py), the consumer
daphne runs in embedded mode, over websockets' asyncio server instead of daphne's Twisted
and Autobahn: per frame, one ASGI message dict and no more (bench/README.md, "Gateway").
The process runs it on uvloop's event loop (the agent_gateway command).
Everything else is as in a web process: the PostgreSQL connection, the channel layer and
live store in Redis, and the live publisher (which flushes this process's samples).

A load balancer sends `/ws/agent/` to gateway processes and everything else (pages, the API,
`/agent/...` HTTP endpoints, browser sockets) to the web processes. The gateway answers
`GET /healthz` itself (200 while it serves) for the balancer's probe, `GET /metrics` with
its own series (gateway/series.py; CLUSTERUI_METRICS_TOKEN as on the web processes), and
`404` to any other path. On SIGTERM or SIGINT it stops listening and closes every agent connection with 1012
(service restart): the agents reconnect after their backoff's full jitter, to the other
gateway processes while this one restarts.
"""

import asyncio
import logging
from http import HTTPStatus

from websockets.asyncio.server import serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Response

from common.stop_signals import stop_on_signals

from .consumers import AgentConsumer
from .protocol import MAX_FRAME_BYTES
from .series import render_gateway_series
from .views import CONTENT_TYPE, scrape_refusal

logger = logging.getLogger(__name__)

AGENT_PATH = "/ws/agent/"
CLOSE_SERVICE_RESTART = 1012
# Connections the kernel holds for accept(), asyncio's 100 otherwise (the kernel caps it at
# net.core.somaxconn, 4,096 by default). A fleet reconnecting at once overflows a short one,
# and each connection refused so is retried by TCP 1, 3, 7 s later, the server idle or not.
LISTEN_BACKLOG = 4096

agent_app = AgentConsumer.as_asgi()


def asgi_scope(connection):
    """The ASGI scope daphne would give AgentConsumer for this connection."""
    request = connection.request
    path, _, query = request.path.partition("?")
    return {
        "type": "websocket",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "scheme": "ws",
        "path": path,
        "raw_path": path.encode("latin-1"),
        "query_string": query.encode("latin-1"),
        "root_path": "",
        "headers": [(name.lower().encode("latin-1"), value.encode("latin-1"))
                    for name, value in request.headers.raw_items()],
        "client": connection.remote_address[:2] if connection.remote_address else None,
        "server": connection.local_address[:2] if connection.local_address else None,
        "subprotocols": [],
        "state": {},
    }


async def serve_agent(connection):
    """One agent connection: AgentConsumer on websockets' connection, as an ASGI server runs
    it. The handshake is done before the consumer starts, so its accept() is already true;
    a frame it sends after the connection closed is dropped, as ASGI servers do."""
    connected = False

    async def receive():
        nonlocal connected
        if not connected:
            connected = True
            return {"type": "websocket.connect"}
        try:
            data = await connection.recv()
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd is not None else 1006
            return {"type": "websocket.disconnect", "code": code}
        if isinstance(data, str):
            return {"type": "websocket.receive", "text": data}
        return {"type": "websocket.receive", "bytes": data}

    async def send(message):
        try:
            if message["type"] == "websocket.send":
                text = message.get("text")
                await connection.send(text if text is not None else message["bytes"])
            elif message["type"] == "websocket.close":
                await connection.close(message.get("code") or 1000, message.get("reason") or "")
        except ConnectionClosed:
            pass

    await agent_app(asgi_scope(connection), receive, send)


def answer_http(connection, request):
    """Only the agent socket upgrades; the balancer's probe, this process's /metrics and
    anything else are answered here, before a handshake."""
    path = request.path.partition("?")[0]
    if path == "/healthz":
        return connection.respond(HTTPStatus.OK, "ok\n")
    if path == "/metrics":
        refusal = scrape_refusal(request.headers.get("Authorization"))
        if refusal is not None:
            status, text, headers = refusal
            response = connection.respond(HTTPStatus(status), text)
            response.headers.update(headers)
            return response
        body = render_gateway_series().encode()
        return Response(HTTPStatus.OK, "OK", Headers([("Content-Type", CONTENT_TYPE),
                                                      ("Content-Length", str(len(body)))]),
                        body)
    if path != AGENT_PATH:
        return connection.respond(HTTPStatus.NOT_FOUND, "the agent gateway serves only "
                                                        f"{AGENT_PATH}\n")
    return None


async def run_gateway(host, port, *, ready=None, stop=None):
    """Serve until SIGTERM/SIGINT (or `stop`, an asyncio.Event, in tests); `ready` is called
    with the bound port once listening."""
    stop = stop_on_signals(stop)
    # No compression: a sample is 2 KB a second per node, and inflating it would cost more
    # of the core than the bytes it saves on a datacenter network.
    async with serve(serve_agent, host, port, process_request=answer_http, compression=None,
                     max_size=MAX_FRAME_BYTES, ping_interval=20, ping_timeout=30,
                     server_header="clusterui-gateway", backlog=LISTEN_BACKLOG) as server:
        bound = server.sockets[0].getsockname()[1]
        logger.info("agent gateway listening on %s:%s%s", host, bound, AGENT_PATH)
        if ready is not None:
            ready(bound)
        await stop.wait()
        logger.info("agent gateway stopping: closing %d agent connections with %d",
                    len(server.connections), CLOSE_SERVICE_RESTART)
        server.close(close_connections=False)
        await asyncio.gather(*(connection.close(CLOSE_SERVICE_RESTART, "service restart")
                               for connection in list(server.connections)),
                             return_exceptions=True)
        await server.wait_closed()
