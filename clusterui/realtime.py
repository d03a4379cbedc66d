"""How sync code (services, tasks) tells open browsers that something changed.

broadcast() sends one message to a channel-layer group now. Throttle sends changes that can
come in storms (an Xid storm raises one event's count thousands of times a second): per
(group, type), at most one message per interval, and the last change is never lost, only
sent when the interval ends.
"""

import asyncio
import logging
import threading
import time

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

logger = logging.getLogger(__name__)

HELD_SEND_TIMEOUT_S = 5.0


def broadcast(group, type, **data):
    """Send {"type": type, **data} to every consumer in `group` (they handle it with the
    method named after the type: "health.changed" -> health_changed)."""
    async_to_sync(get_channel_layer().group_send)(group, {"type": type, **data})


async def _running_loop():
    return asyncio.get_running_loop()


class Throttle:
    """broadcast() at most once per `interval_s` per (group, type), in this process.

    The first message goes at once. Messages that come sooner after it are held (the latest
    replaces the one held before) and the held one goes when the interval ends.
    """

    def __init__(self, interval_s):
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._sent_at = {}  # (group, type) -> time.monotonic() of its last send
        self._held = {}  # (group, type) -> data of the message to send when the interval ends

    def broadcast(self, group, type, **data):
        key = (group, type)
        with self._lock:
            if key in self._held:  # its send is already scheduled: it will carry this one
                self._held[key] = data
                return
            now = time.monotonic()
            wait_s = self._sent_at.get(key, now - self.interval_s) + self.interval_s - now
            if wait_s <= 0:
                self._sent_at[key] = now
            else:
                self._held[key] = data
        if wait_s <= 0:
            broadcast(group, type, **data)
        else:
            self._send_held_later(key, wait_s)

    def _send_held_later(self, key, wait_s):
        # The held message must reach the channel layer from the event loop that async_to_sync
        # uses for this thread: in a server process, the loop its consumers run on (the
        # in-memory layer of embedded mode and tests is not thread-safe). A worker or a shell
        # has none: async_to_sync ran on a loop of its own, closed by now, and so will the
        # held send.
        loop = async_to_sync(_running_loop)()
        timer = threading.Timer(wait_s, self._send_held, args=(key, loop))
        timer.daemon = True
        timer.start()

    def _send_held(self, key, loop):
        group, type = key
        with self._lock:
            data = self._held.pop(key)
            self._sent_at[key] = time.monotonic()
        message = {"type": type, **data}
        try:
            if loop.is_running():
                sent = asyncio.run_coroutine_threadsafe(
                    get_channel_layer().group_send(group, message), loop)
                sent.result(timeout=HELD_SEND_TIMEOUT_S)
            else:
                broadcast(group, type, **data)
        except Exception:
            logger.exception("sending the held %s to %s failed", type, group)
