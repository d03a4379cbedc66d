"""daphne's WebSocket closes reach the peer: the close frame (an agent's 4401, 4409, ...) is
written before the connection is dropped.

When the server closes a WebSocket, autobahn (under daphne) sends the close frame and drops the
connection, with a TCP reset, if the peer has not answered it within closeHandshakeTimeout
(1 s by default). Its timers go through txaio's batched timer, which rounds each deadline down
to a whole second (txaio 26.6, _BatchedTimer.call_later: `int(now + delay)`), so the drop may
come a few milliseconds after the close. Twisted writes a connection's bytes in a later turn
of the loop, and its abortConnection() discards what it has not written: on a busy loop the
peer then got a reset with neither the close frame nor, for a connection accepted and closed
at once, the 101 before it. An agent told 4401 (its token no longer works) saw a network error
and reconnected, to be told again (tests/test_agent_upgrade_turns.py failed so in CI).

With CLOSE_HANDSHAKE_TIMEOUT_S the drop comes 4-5 s after the close frame was queued, long
after it was written. A peer that answers (our agent does at once) is dropped at its answer,
as before.

install() gives daphne's WebSocket factory that timeout; clusterui/asgi.py calls it.
"""

from daphne import server as daphne_server

CLOSE_HANDSHAKE_TIMEOUT_S = 5


def install():
    """daphne's server builds its WebSocket factory (WebSocketFactory, a name of its module,
    looked up when it starts) with CLOSE_HANDSHAKE_TIMEOUT_S; it sets its other options after.
    Only daphne's server uses that name: in uvicorn and the gateway process (where daphne's
    app imports the module too, as Django sets up) nothing else changes."""
    build_factory = daphne_server.WebSocketFactory

    def build_factory_closing_in_time(*args, **kwargs):
        factory = build_factory(*args, **kwargs)
        factory.setProtocolOptions(closeHandshakeTimeout=CLOSE_HANDSHAKE_TIMEOUT_S)
        return factory

    daphne_server.WebSocketFactory = build_factory_closing_in_time
