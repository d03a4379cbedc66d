"""The live store: the latest sample of every node, and nothing older.

Samples never reach the database. The agent consumer calls record() for each sample (no
I/O); the publisher calls flush() every 50 ms, and its leader read_fold() once a second.
The process that folds a sample (nodes/live_fold.py) makes its NodeReading and adds it to
its NodeMinute in one pass over its GPUs.

An entry is kept encoded, as one JSON object: the sample's fields, its node's id, when it
was received, each GPU's memory total (from the hello) and the connection's latest hygiene.
Readers get it as a dict (decode_entry).

- MemoryLiveStore (embedded mode): process memory; the one server process sees everything
  and folds every sample.
- RedisLiveStore (production): record() buffers the entry, encoded; flush() writes the
  newest entry of each node to one Redis hash per cluster, so that every server process
  reads the whole fleet (pages, /metrics), and, in a process that does not lead, every
  sample's entry to one Redis list, in one pipeline. The publisher's leader alone folds
  samples: its own as it records them (set_leading), every other process's from the list
  in read_fold(), and it writes the fleet's node minutes. A process that does not lead
  spends nothing on the fold: beside `manage.py publisher`, with
  CLUSTERUI_PUBLISHER_LEADS=false, daphne and the agent gateways only read, check and store
  their samples (bench/README.md, "The fold handed to the publisher").
"""

import asyncio
import logging

import msgspec
import orjson
from django.conf import settings

from .live_fold import GPU_AT_LOAD, LiveFold, LiveSample, NodeMinute
from .rollups import GPU_METRICS, NODE_METRICS


logger = logging.getLogger(__name__)

LIVE_KEY = "clusterui:live:{cluster_id}"
# Samples recorded by every server process since Redis started: one INCRBY per flush
# (bench/ingest reads it to count what was delivered).
RECORDED_KEY = "clusterui:live:recorded"
# A node that stopped reporting drops out of the store after this long.
LIVE_TTL_S = 3600
# The entries of every sample recorded by a process that does not lead, for the leader's
# fold: one list item per flush, its lines a cluster's id and then that cluster's entries
# (an entry is one line of JSON: msgspec writes it compact, control characters escaped).
# The leader takes them all once a second; while it is late (a long tick, a handover), the
# newest items are kept: a minute of one process's flushes, 12 s of ten processes'.
SAMPLES_KEY = "clusterui:live:samples"
SAMPLES_KEPT = 1200
SAMPLES_TTL_S = 60


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


# What the fold reads of an entry (nodes/live_fold.py NodeMinute.add: the metrics and the
# GPUs at load), as structs made from those field lists: a GPU's and a node's readings are
# numbers and strings, which the collector need not track.
_Reading = int | float | None
_FoldGpu = msgspec.defstruct(
    "FoldGpu", [("uuid", str)] + [(field, _Reading, None) for field in
                                  dict.fromkeys(GPU_METRICS + GPU_AT_LOAD) if field != "uuid"],
    gc=False)
_FoldNode = msgspec.defstruct("FoldNode", [(field, _Reading, None) for field in NODE_METRICS],
                              gc=False)


class _FoldEntry(msgspec.Struct):
    node_id: int
    received_at: float
    seq: int
    ts: int | float
    gpus: list[_FoldGpu]
    mem_totals: list[int | None]
    node: _FoldNode


_fold_entry_decoder = msgspec.json.Decoder(_FoldEntry)


def _decode_samples(items):
    """[(cluster id, LiveSample)] of the samples list's items, oldest first. What this
    version cannot read (another version's entry, in a rolling upgrade) is left out, and
    logged."""
    samples, unread = [], 0
    for item in items:
        cluster_id = None
        for line in item.split(b"\n"):
            if not line.startswith(b"{"):
                try:
                    cluster_id = int(line)
                except ValueError:
                    cluster_id = None
                    unread += 1
                continue
            try:
                e = _fold_entry_decoder.decode(line)
            except msgspec.MsgspecError:
                e = None
            if e is None or cluster_id is None:
                unread += 1
                continue
            samples.append((cluster_id, LiveSample(e.node_id, e.received_at, e.seq, e.ts,
                                                   e.gpus, e.mem_totals, e.node, None)))
    if unread:
        logger.warning("%d lines of the samples handed over through Redis could not be "
                       "read: not folded", unread)
    return samples


# The leader folds the others' samples on its event loop, where its own are folded as they
# arrive; this many at a time, so that its own frames and pages wait a few ms at most.
FOLD_CHUNK = 500


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
        """The one process folds every sample, leading or not."""

    async def flush(self):
        return 0

    async def read_fold(self):
        """The fold of every sample (the publisher's leader, once a second)."""
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
        self.pending_samples = {}  # cluster_id -> [entries to fold], while not leading
        self.recorded = 0  # samples recorded since the last flush
        self.fold = LiveFold()  # every process's samples, while this process leads
        self.node_minute = NodeMinute()  # of the samples folded here
        self.leading = False  # the publisher's leader: it folds every process's samples
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
        entry = encode_entry(sample)
        self.pending.setdefault(cluster_id, {})[sample.node_id] = entry
        if self.leading:
            self._fold(cluster_id, sample)
        else:
            self.pending_samples.setdefault(cluster_id, []).append(entry)
        self.recorded += 1

    def _fold(self, cluster_id, sample):
        self.fold.add(cluster_id, self.node_minute.add(sample, _min_util_pct()))

    def set_leading(self, leading):
        """Whether this process leads now (the publisher's lease, renewed every second). A
        sample recorded while it leads is folded here at once; the others' come through
        Redis. One that loses the lease sends its samples to the new leader once it knows
        (its next renewal, within a second), and lets go of its fold and its unfinished
        minute: the minute of a handover is the new leader's part of it, written once."""
        if self.leading and not leading:
            self.fold, self.node_minute = LiveFold(), NodeMinute()
        self.leading = leading

    async def flush(self):
        pending, self.pending = self.pending, {}
        to_fold, self.pending_samples = self.pending_samples, {}
        recorded, self.recorded = self.recorded, 0
        if not pending:
            return 0
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.incrby(RECORDED_KEY, recorded)
            for cluster_id, entries in pending.items():
                key = LIVE_KEY.format(cluster_id=cluster_id)
                pipe.hset(key, mapping=entries)
                pipe.expire(key, LIVE_TTL_S)
            if to_fold:
                pipe.rpush(SAMPLES_KEY, b"\n".join(
                    line for cluster_id, entries in to_fold.items()
                    for line in (b"%d" % cluster_id, *entries)))
                pipe.ltrim(SAMPLES_KEY, -SAMPLES_KEPT, -1)
                pipe.expire(SAMPLES_KEY, SAMPLES_TTL_S)
            await pipe.execute()
        return sum(len(entries) for entries in pending.values())

    async def read_fold(self):
        """Every other process's samples since the last call, folded here (the leader)."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.lrange(SAMPLES_KEY, 0, -1)
            pipe.delete(SAMPLES_KEY)
            items, _ = await pipe.execute()
        # Decoded in a worker thread: on the event loop it would hold up the ingest.
        samples = await asyncio.to_thread(_decode_samples, items)
        for start in range(0, len(samples), FOLD_CHUNK):
            if start:
                await asyncio.sleep(0)
            for cluster_id, sample in samples[start:start + FOLD_CHUNK]:
                self._fold(cluster_id, sample)
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
