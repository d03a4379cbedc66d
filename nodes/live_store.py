"""The live store: the latest sample of every node, and nothing older.

Samples never reach the database. The agent consumer calls record() for each sample (no
I/O); the publisher calls flush() every 50 ms, and its leader read_fold() once a second.
record() also folds the sample into what the publisher's tick needs (nodes/live_fold.py):
its NodeReading and this process's NodeMinute, in one pass over its GPUs.

An entry is kept encoded, as one JSON object: the sample's fields, its node's id, when it
was received, each GPU's memory total (from the hello) and the connection's latest hygiene.
Readers get it as a dict (decode_entry).

- MemoryLiveStore (embedded mode): process memory; the one server process sees everything
  and folds every reading.
- RedisLiveStore (production): record() buffers the entry and its reading, encoded;
  flush() writes the entries to one Redis hash per cluster, so that every server process
  reads the whole fleet (pages, /metrics), and appends the readings to one Redis list, in
  one pipeline. The leader's read_fold() takes the list's readings into its fold; its own
  readings it folds as it records them (set_leading), without the round trip.
"""

import asyncio

import msgspec
import orjson
from django.conf import settings

from .live_fold import LiveFold, NodeMinute, decode_reading, encode_reading


LIVE_KEY = "clusterui:live:{cluster_id}"
# Samples recorded by every server process since Redis started: one INCRBY per flush
# (bench/ingest reads it to count what was delivered).
RECORDED_KEY = "clusterui:live:recorded"
# A node that stopped reporting drops out of the store after this long.
LIVE_TTL_S = 3600
# Every process's readings since the leader's last read_fold(), a JSON list per flush. While
# no process leads (a handover), the newest batches are kept: enough for a minute of 10
# processes, each flushing 10 times a second.
READINGS_KEY = "clusterui:live:readings"
READINGS_KEPT = 6000
READINGS_TTL_S = 60


def stale_after_s():
    """A live entry older than this is no longer "now": the node's telemetry is stale."""
    return settings.CLUSTERUI_SAMPLE_INTERVAL_S * settings.CLUSTERUI_HEARTBEAT_INTERVALS


# msgspec, not orjson: a sample's GPUs and node arrive as msgspec structs (gateway.protocol),
# which it writes as JSON objects of all their fields, without making a dict of each first.
_entry_encoder = msgspec.json.Encoder()


def encode_entry(sample):
    """A LiveSample as the store keeps it. Every value a valid sample holds is JSON
    (gateway.protocol: finite numbers, integers within 64 bits)."""
    return _entry_encoder.encode({
        "node_id": sample.node_id, "seq": sample.seq, "ts": sample.ts,
        "received_at": sample.received_at, "gpus": sample.gpus,
        "mem_totals": sample.mem_totals, "node": sample.node, "hygiene": sample.hygiene})


def decode_entry(raw):
    """An entry as readers have it: {node_id, seq, ts, received_at, gpus, node, hygiene},
    each GPU a dict of the protocol's fields and its mem_total_bytes."""
    entry = orjson.loads(raw)
    totals = entry.pop("mem_totals", None)
    if totals is not None:  # (an entry written before 2026-12-04 holds each GPU's total)
        for gpu, total in zip(entry["gpus"], totals):
            gpu["mem_total_bytes"] = total
    return entry


def _decode_all(raw):
    """{node id: entry} from a live hash as Redis returns it."""
    return {int(node_id): decode_entry(value) for node_id, value in raw.items()}


def _decode_readings(batches):
    """[(cluster id, NodeReading)] of the readings' batches, oldest first."""
    return [decode_reading(values) for batch in batches for values in orjson.loads(batch)]


def _min_util_pct():
    """Where the slow GPU rule starts comparing a GPU: the fold keeps only such GPUs."""
    return settings.CLUSTERUI_SLOW_GPU_MIN_UTIL_PCT


class MemoryLiveStore:
    def __init__(self):
        self.latest = {}  # cluster_id -> {node_id: entry}
        self.fold = LiveFold()
        self.node_minute = NodeMinute()

    def record(self, cluster_id, sample):
        self.latest.setdefault(cluster_id, {})[sample.node_id] = encode_entry(sample)
        self.fold.add(cluster_id, self.node_minute.add(sample, _min_util_pct()))

    def set_leading(self, leading):
        """The one process folds every reading, leading or not."""

    async def flush(self):
        return 0

    async def read_fold(self):
        """The fold of every reading (the publisher's leader, once a second)."""
        return self.fold

    def read(self, cluster_id):
        """The snapshot, for synchronous callers (views)."""
        return _decode_all(self.latest.get(cluster_id, {}))

    def read_node(self, cluster_id, node_id):
        """One node's entry, or None (the node page's live numbers)."""
        raw = self.latest.get(cluster_id, {}).get(node_id)
        return None if raw is None else decode_entry(raw)

    async def close(self):
        pass


class RedisLiveStore:
    def __init__(self, url):
        self.url = url
        self.pending = {}  # cluster_id -> {node_id: the entry, encoded}
        self.pending_readings = []  # this process's readings since the last flush, encoded
        self.recorded = 0  # samples recorded since the last flush
        self.fold = LiveFold()  # every process's readings; read_fold() fills it (the leader)
        self.node_minute = NodeMinute()  # of this process's samples
        self.leading = False  # the publisher's leader: its own readings go into its fold
        self._client = None

    @property
    def client(self):
        if self._client is None:
            import redis.asyncio

            self._client = redis.asyncio.Redis.from_url(self.url)
        return self._client

    def record(self, cluster_id, sample):
        # Encoded now, not at the flush: the buffer then holds bytes, which the garbage
        # collector never scans (held until the flush, thousands of a sample's objects a
        # second were promoted to the oldest generation, and each of its full collections
        # stopped the process for up to a quarter of a second).
        self.pending.setdefault(cluster_id, {})[sample.node_id] = encode_entry(sample)
        reading = self.node_minute.add(sample, _min_util_pct())
        if self.leading:
            self.fold.add(cluster_id, reading)
        else:
            self.pending_readings.append(orjson.dumps(encode_reading(cluster_id, reading)))
        self.recorded += 1

    def set_leading(self, leading):
        """Whether this process leads the publisher now (its lease, renewed every second).
        A reading recorded while it leads goes straight into its fold; the others' come
        through Redis. One that loses the lease sends its readings to the new leader again
        once it knows (its next renewal, within a second): until then they stay in its own
        fold, and the nodes reach the new leader's with their next samples."""
        self.leading = leading

    async def flush(self):
        pending, self.pending = self.pending, {}
        readings, self.pending_readings = self.pending_readings, []
        recorded, self.recorded = self.recorded, 0
        if not pending:
            return 0
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.incrby(RECORDED_KEY, recorded)
            for cluster_id, entries in pending.items():
                key = LIVE_KEY.format(cluster_id=cluster_id)
                pipe.hset(key, mapping=entries)
                pipe.expire(key, LIVE_TTL_S)
            if readings:
                pipe.rpush(READINGS_KEY, b"[" + b",".join(readings) + b"]")
                pipe.ltrim(READINGS_KEY, -READINGS_KEPT, -1)
                pipe.expire(READINGS_KEY, READINGS_TTL_S)
            await pipe.execute()
        return sum(len(entries) for entries in pending.values())

    async def read_fold(self):
        """Every process's readings since the last call, taken into this process's fold."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.lrange(READINGS_KEY, 0, -1)
            pipe.delete(READINGS_KEY)
            batches, _ = await pipe.execute()
        # Decoded in a worker thread: on the event loop it would hold up the ingest.
        for cluster_id, reading in await asyncio.to_thread(_decode_readings, batches):
            self.fold.add(cluster_id, reading)
        return self.fold

    def read(self, cluster_id):
        """The snapshot, for synchronous callers (views), on a connection of their own."""
        import redis

        with redis.Redis.from_url(self.url) as client:
            raw = client.hgetall(LIVE_KEY.format(cluster_id=cluster_id))
        return _decode_all(raw)

    def read_node(self, cluster_id, node_id):
        """One node's entry, or None: one HGET, where read() carries the whole cluster's
        hash (about 5 MB for 2,000 nodes) for each node page's poll."""
        import redis

        with redis.Redis.from_url(self.url) as client:
            raw = client.hget(LIVE_KEY.format(cluster_id=cluster_id), node_id)
        return None if raw is None else decode_entry(raw)

    async def close(self):
        if self._client is not None:
            await self._client.aclose()
            self._client = None


_store = None


def get_live_store():
    """This process's live store, as the mode says."""
    global _store
    if _store is None:
        _store = RedisLiveStore(settings.REDIS_URL) if settings.REDIS_URL else MemoryLiveStore()
    return _store


def reset_live_store():
    """Forget this process's store (tests switch settings between them)."""
    global _store
    _store = None
