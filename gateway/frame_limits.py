"""What the agent socket takes in, and how fast (PROTOCOL.md, "Limits"): pure bookkeeping,
no I/O. gateway.consumers asks before it handles a frame; a frame refused here is answered
`rate_limited` with a retry_after_s and never reaches the database.

- FrameBucket: per connection, a token bucket for every frame but samples (events,
  results, hellos): CLUSTERUI_AGENT_FRAMES_PER_S, bursts of CLUSTERUI_AGENT_FRAME_BURST.
- NewEventCounts: per node and server process, the new events of the current hour
  (CLUSTERUI_AGENT_NEW_EVENTS_PER_HOUR). A node has one connection at a time; one that
  reconnects to another server process starts a new count there, so a node may store up to
  that many an hour on each process. (The cap on its open events is the database's to
  count: gateway.ingest.)
- HelloAdmission: per server process, how many hellos are in hand.
"""

import random
import time
from collections import deque


class FrameBucket:
    """A token bucket. A refused frame is given a turn: the first when the next token comes,
    each one after it a token later, so an agent that sends its whole outbox at once and
    waits as told comes back at the bucket's rate instead of all at once. No turn is more
    than a burst away."""

    def __init__(self, rate_per_s, burst, clock=time.monotonic):
        self.rate, self.burst, self.clock = rate_per_s, burst, clock
        self.tokens, self.updated = float(burst), clock()
        self.next_turn = 0.0

    def take(self):
        """0 when a frame may go now (it takes a token); else the seconds until its turn."""
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        turn = max(now + (1 - self.tokens) / self.rate, self.next_turn)
        turn = min(turn, now + (self.burst + 1) / self.rate)
        self.next_turn = turn + 1 / self.rate
        return turn - now


class NewEventCounts:
    def __init__(self, clock=time.time):
        self.clock = clock
        self.hour, self.counts = None, {}  # node_id -> new events this hour

    def take(self, node_id, limit):
        """0 when the node may store one more new event this hour (it is counted); else the
        seconds until the next hour."""
        now = self.clock()
        hour = int(now // 3600)
        if hour != self.hour:
            self.hour, self.counts = hour, {}
        if self.counts.get(node_id, 0) >= limit:
            return (hour + 1) * 3600 - now
        self.counts[node_id] = self.counts.get(node_id, 0) + 1
        return 0.0

    def give_back(self, node_id):
        """An event counted that turned out not new (a resend stored before) or not stored."""
        if self.counts.get(node_id):
            self.counts[node_id] -= 1


class HelloAdmission:
    """How many hellos this process has in hand. Past `limit` (about `seconds_of_work` of
    work) a hello is answered rate_limited at once: left to queue, it would wait past the
    agent's welcome timeout, and the work done for it would be lost when the agent gives up.

    The answer's retry_after_s is the hello's turn. Turns are handed out one after another,
    1 / (the hellos finished a second) apart, so the refused agents come back at the pace
    this process finishes hellos: a thousand nodes joining at once are neither all back in
    the next second (each refusal costs the core too) nor kept waiting while the process
    idles. The pace is measured over the last WINDOW_S; until MIN_FINISHED hellos have
    finished there, it is `limit` over `seconds_of_work`, what the limit was sized for. A
    turn further off than MAX_RETRY_AFTER_S is not given: that hello is told a wait of half
    to all of it, and asks for a turn again then. The most stays under the agent's welcome
    timeout (30 s, which it restarts only once it has said the hello again)."""

    WINDOW_S = 10.0
    MIN_FINISHED = 16
    MIN_RETRY_AFTER_S = 0.5
    MAX_RETRY_AFTER_S = 15.0

    def __init__(self, limit, seconds_of_work, clock=time.monotonic):
        self.limit, self.seconds_of_work, self.in_hand = limit, seconds_of_work, 0
        self.clock = clock
        self.finished = deque()  # times, within WINDOW_S
        self.last_turn = 0.0  # the clock's time of the latest turn given

    def admit(self):
        if self.in_hand >= self.limit:
            return False
        self.in_hand += 1
        return True

    def done(self):
        self.in_hand -= 1
        self.finished.append(self.clock())

    def finished_per_s(self):
        now = self.clock()
        while self.finished and self.finished[0] < now - self.WINDOW_S:
            self.finished.popleft()
        if len(self.finished) < self.MIN_FINISHED:
            return self.limit / self.seconds_of_work
        # Over the time the window holds: at the start of a storm that is less than WINDOW_S.
        return len(self.finished) / max(now - self.finished[0], 1.0)

    def retry_after(self):
        """The next turn, in seconds from now."""
        now = self.clock()
        turn = max(self.last_turn, now) + 1 / self.finished_per_s()
        if turn - now > self.MAX_RETRY_AFTER_S:
            return round(self.MAX_RETRY_AFTER_S * random.uniform(0.5, 1.0), 1)
        self.last_turn = turn
        return round(max(turn - now, self.MIN_RETRY_AFTER_S), 1)
