"""The live store: the latest sample of every node, and nothing older.

Samples never reach the database. The agent consumer calls record() for each sample (no
I/O); the publisher calls flush() every 100 ms and snapshot() once a second.

- MemoryLiveStore (embedded mode): process memory; the one server process sees everything.
- RedisLiveStore (production): record() encodes the entry and buffers it; flush() writes the
  buffer to one Redis hash per cluster in one pipeline, so every server process reads the
  whole fleet.
"""

import asyncio

import orjson
from django.conf import settings


LIVE_KEY = "clusterui:live:{cluster_id}"
# Samples recorded by every server process since Redis started: one INCRBY per flush
# (bench/ingest reads it to count what was delivered).
RECORDED_KEY = "clusterui:live:recorded"
# A node that stopped reporting drops out of the store after this long.
LIVE_TTL_S = 3600


def stale_after_s():
    """A live entry older than this is no longer "now": the node's telemetry is stale."""
    return settings.CLUSTERUI_SAMPLE_INTERVAL_S * settings.CLUSTERUI_HEARTBEAT_INTERVALS


def _encode(entry):
    """An entry as JSON. orjson takes every value a valid sample holds (gateway.protocol:
    finite numbers, integers within 64 bits)."""
    return orjson.dumps(entry)


def _decode(raw):
    return orjson.loads(raw)


def _decode_all(raw):
    """{node id: entry} from a live hash as Redis returns it."""
    return {int(node_id): _decode(value) for node_id, value in raw.items()}


class MemoryLiveStore:
    def __init__(self):
        self.latest = {}  # cluster_id -> {node_id: entry}

    def record(self, cluster_id, entry):
        self.latest.setdefault(cluster_id, {})[entry["node_id"]] = entry

    async def flush(self):
        return 0

    async def snapshot(self, cluster_id):
        return self.read(cluster_id)

    def read(self, cluster_id):
        """The snapshot, for synchronous callers (views)."""
        return dict(self.latest.get(cluster_id, {}))

    def read_node(self, cluster_id, node_id):
        """One node's entry, or None (the node page's live numbers)."""
        return self.latest.get(cluster_id, {}).get(node_id)

    async def close(self):
        pass


class RedisLiveStore:
    def __init__(self, url):
        self.url = url
        self.pending = {}  # cluster_id -> {node_id: the entry, encoded}
        self.recorded = 0  # samples recorded since the last flush
        self._client = None

    @property
    def client(self):
        if self._client is None:
            import redis.asyncio

            self._client = redis.asyncio.Redis.from_url(self.url)
        return self._client

    def record(self, cluster_id, entry):
        # Encoded now, not at the flush: the buffer then holds bytes, which the garbage
        # collector never scans, and the entry's dicts die young (held until the flush,
        # thousands a second were promoted to the oldest generation, and each of its full
        # collections stopped the process for up to a quarter of a second).
        self.pending.setdefault(cluster_id, {})[entry["node_id"]] = _encode(entry)
        self.recorded += 1

    async def flush(self):
        pending, self.pending = self.pending, {}
        recorded, self.recorded = self.recorded, 0
        if not pending:
            return 0
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.incrby(RECORDED_KEY, recorded)
            for cluster_id, entries in pending.items():
                key = LIVE_KEY.format(cluster_id=cluster_id)
                pipe.hset(key, mapping=entries)
                pipe.expire(key, LIVE_TTL_S)
            await pipe.execute()
        return sum(len(entries) for entries in pending.values())

    async def snapshot(self, cluster_id):
        raw = await self.client.hgetall(LIVE_KEY.format(cluster_id=cluster_id))
        # Decoded in a worker thread: 2,000 entries take 20-40 ms, which on the event loop
        # held up the ingest (bench/README.md).
        return await asyncio.to_thread(_decode_all, raw)

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
        return None if raw is None else _decode(raw)

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
