"""Agent events go to the database a batch at a time: one writer per server process.

Every agent connection of the process hands its event to the writer and waits for the
outcome before it acks (PROTOCOL.md: an ack means stored). While one batch is written, the
events that arrive wait, and the next batch takes them all: at a trickle a batch is one
event and nothing waits on a timer; in a storm, one transaction stores hundreds
(gateway.ingest.ingest_events), and each node's state is refreshed once per batch.
"""

import asyncio
import logging
import weakref
from concurrent.futures import ThreadPoolExecutor

from channels.db import database_sync_to_async

from . import ingest

logger = logging.getLogger(__name__)

MAX_BATCH = 500
# One batch at a time, on a thread of its own: never the thread Django's sync views share.
EVENT_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agent-events")

_writers = weakref.WeakKeyDictionary()  # one per event loop (tests run several)


class EventWriter:
    def __init__(self):
        self._waiting = []  # (node_id, frame, future)
        self._task = None

    async def store(self, node_id, frame):
        """The event's ingest.EventOutcome, once its batch is written."""
        future = asyncio.get_running_loop().create_future()
        self._waiting.append((node_id, frame, future))
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._write_batches())
        return await future

    async def _write_batches(self):
        while self._waiting:
            batch, self._waiting = self._waiting[:MAX_BATCH], self._waiting[MAX_BATCH:]
            try:
                outcomes = await database_sync_to_async(
                    ingest.ingest_events, thread_sensitive=False, executor=EVENT_THREAD)(
                    [(node_id, frame) for node_id, frame, _ in batch])
            except Exception:  # noqa: BLE001 - every waiting connection gets its answer
                logger.exception("a batch of %d agent events was not stored", len(batch))
                outcomes = [ingest.EventOutcome.FAILED] * len(batch)
            for (_, _, future), outcome in zip(batch, outcomes):
                if not future.done():
                    future.set_result(outcome)


def event_writer():
    """This event loop's writer."""
    loop = asyncio.get_running_loop()
    writer = _writers.get(loop)
    if writer is None:
        writer = _writers[loop] = EventWriter()
    return writer
