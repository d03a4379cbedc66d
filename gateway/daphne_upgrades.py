"""Agents' WebSocket upgrades on daphne, a few per turn of the event loop, so that people's
pages never wait behind a fleet's handshakes.

A web process's one event loop serves pages, browser sockets and (in embedded mode, or
without gateway processes) the agent socket. When a thousand nodes connect at once, daphne
accepts them all within a turn or two, and the next turn upgrades every one of them: about
2.5 ms each (autobahn's handshake, daphne's application instance, the consumer's connect),
seconds of one turn in which no page is answered. A page's request takes several turns
(read, the view on a thread, the reply), and one of them waited 1.7-2.9 s in each of
bench/storm's embedded joins of 1,000 nodes (bench/README.md, "Embedded mode").

Here an agent's upgrade (`/ws/agent/`) is done at once while fewer than
AGENT_UPGRADES_PER_TURN were done in this turn of the loop, and otherwise waits in order for
a later turn. Every other request (pages, the API, browser sockets) is processed as it
arrives. An agent waits at most its place in the line: the upgrades go on at the loop's
speed, a few at a time, between everything else. Two at a time (about 5 ms of a turn), the
same joins' pages took at most 0.41-0.48 s, p99 0.19-0.26 s; four at a time, at most
0.42-0.61 s, p99 0.34-0.48 s; one at a time, no better than two.

install() makes daphne's HTTP factory build these requests; clusterui/asgi.py calls it.
"""

from collections import deque

from daphne import http_protocol

from .series import AGENT_UPGRADES_WAITED, AGENT_UPGRADES_WAITING
from .server import AGENT_PATH

AGENT_UPGRADES_PER_TURN = 2


class UpgradeTurns:
    """At most `per_turn` upgrades run in one turn of the reactor's loop; the rest wait, in
    the order they came, for the turns after it."""

    def __init__(self, per_turn, call_next_turn):
        self.per_turn = per_turn
        self.call_next_turn = call_next_turn  # f -> None: runs f in a later turn of the loop
        self.waiting = deque()
        self.done_this_turn = 0
        self.next_turn_called = False

    def admit(self, upgrade):
        """Runs `upgrade` now, or in a later turn; True where it was made to wait."""
        if not self.waiting and self.done_this_turn < self.per_turn:
            self._run(upgrade)
            return False
        self.waiting.append(upgrade)
        self._call_next_turn()
        return True

    def _run(self, upgrade):
        self.done_this_turn += 1
        self._call_next_turn()  # where this turn's count starts again
        upgrade()

    def _call_next_turn(self):
        if not self.next_turn_called:
            self.next_turn_called = True
            self.call_next_turn(self._next_turn)

    def _next_turn(self):
        self.next_turn_called = False
        self.done_this_turn = 0
        for _ in range(min(self.per_turn, len(self.waiting))):
            self._run(self.waiting.popleft())


def call_next_turn(func):
    # Imported here: importing the reactor installs one, and daphne installs its own first.
    from twisted.internet import reactor

    reactor.callLater(0, func)


AGENT_PATH_BYTES = AGENT_PATH.encode()
AGENT_UPGRADES = UpgradeTurns(AGENT_UPGRADES_PER_TURN, call_next_turn)
AGENT_UPGRADES_WAITING.set_function(lambda: len(AGENT_UPGRADES.waiting))


class PacedAgentUpgradeRequest(http_protocol.WebRequest):
    """daphne's request, its agent upgrades taken in turns (AGENT_UPGRADES)."""

    def process(self):
        if self.path == AGENT_PATH_BYTES and self._asks_for_websocket():
            if AGENT_UPGRADES.admit(self._upgrade):
                AGENT_UPGRADES_WAITED.inc()
            return None
        return super().process()

    def _asks_for_websocket(self):
        upgrade = self.requestHeaders.getRawHeaders(b"upgrade") or [b""]
        return upgrade[0].lower() == b"websocket"

    def _upgrade(self):
        if not self._disconnected:  # an agent that left while it waited is not upgraded
            super().process()


def install():
    """daphne's HTTP factory builds PacedAgentUpgradeRequest (it names WebRequest, its
    module's, when it builds each connection's channel)."""
    http_protocol.WebRequest = PacedAgentUpgradeRequest
