"""The live samples, folded in as they are recorded: what the publisher's tick needs, at a
cost per sample instead of a cost per node every second.

The tick used to decode every node's latest entry each second and add them all up: for
2,000 nodes, 40 % of a core before any sample arrived (bench/README.md, 2026-12-02). Now the
samples are reduced in batches, the ones recorded since the live store's last flush, every
50 ms (nodes/live_store.py):
- to a NodeReading each: its usage as a few numbers, and its GPUs at load (the slow GPU rule
  compares only those). A ClusterFold keeps each node's latest reading with running sums,
  and lets a reading go when it turns stale: the tick reads the sums, the nodes heard since
  the last tick (last_seen) and the GPUs at load;
- into a NodeMinute: each node's minute of GPU and node metrics, written as NodeRollup rows
  when the minute ends.

In embedded mode the one process folds its own samples. In production every server process
sends its readings to Redis, where the publisher's leader folds them (nodes/live_store.py),
and writes the minutes of the nodes whose samples it received.
"""

from datetime import datetime, timezone as dt_timezone
from itertools import chain
from operator import attrgetter
from typing import NamedTuple

import numpy as np

from .rollups import CLUSTER_METRICS, GPU_METRICS, NODE_METRICS, READING_MAX, add_values


class LiveSample(NamedTuple):
    """A sample as the live store takes it (gateway.protocol.live_sample makes it)."""

    node_id: int
    received_at: float  # Unix seconds, the server's clock
    seq: int
    ts: float  # the agent's clock
    # Readings are None or within READING_MAX (nodes/rollups.py): added up unchecked here.
    gpus: list  # each with the protocol's GPU fields as attributes (None: no reading)
    mem_totals: list  # each GPU's memory in bytes, from the node's hello (None: not told)
    node: object  # the protocol's node fields as attributes
    hygiene: dict | None  # the connection's latest sample.hygiene (gateway.protocol)


# A GPU at load as the slow GPU rule (healthchecks/slow_gpus.py) reads it: a plain tuple (or
# list, as JSON gives it back) of these fields, which costs a tenth of a named tuple to make.
GPU_AT_LOAD = ("uuid", "util_pct", "sm_clock_mhz", "temp_c", "power_w", "clock_event_reasons")


gpu_at_load = attrgetter(*GPU_AT_LOAD)  # a sample's GPU as GPU_AT_LOAD's fields
_node_metric_values = attrgetter(*NODE_METRICS)


class NodeReading(NamedTuple):
    node_id: int
    received_at: float
    gpus: int
    util_sum: float  # of the GPUs with a utilization reading
    util_count: int
    mem_used: float  # of the GPUs with both memory readings
    mem_total: float
    net_bps: float  # received and sent
    sm_active_sum: float  # of the GPUs with an SM activity reading (GPM: Hopper and later)
    sm_active_count: int
    at_load: tuple  # GPU_AT_LOAD of the GPUs at min_util_pct or more with an SM clock


# NodeReading's fields a cluster sums up.
SUMMED = slice(2, 10)
NO_SUMS = [0] * (SUMMED.stop - SUMMED.start)


def encode_reading(cluster_id, node_reading):
    """A reading as a JSON-ready list, for the leader's fold in another process."""
    return [cluster_id, *node_reading]


def decode_reading(values):
    """(cluster id, NodeReading) of encode_reading()'s list (its GPUs at load as lists)."""
    return values[0], NodeReading(*values[1:])


class ClusterFold:
    """A cluster's latest reading of each node that is not stale, and their sums."""

    def __init__(self):
        self.readings = {}  # node id -> NodeReading
        # The node ids with a reading received in each whole second (a few dozen seconds at
        # most: the stale time's), so that expire() looks only at the seconds turning stale.
        # A heap entry per reading (90,000 at 6,000 samples a second) held the event loop for
        # 20-30 ms at every tick, popping them out of the busy process's caches; a set per
        # second did not once (bench/README.md, --stalls). A replaced reading's node id stays
        # in its second until then.
        self.by_second = {}
        self.sums = list(NO_SUMS)  # of NodeReading's SUMMED fields
        self.heard = set()  # node ids with a reading since take_heard()

    def add(self, node_reading):
        old = self.readings.get(node_reading.node_id)
        if old is not None:
            if old.received_at > node_reading.received_at:
                # An older reading come late: the node moved to the leader's own process,
                # whose readings are folded at once, from one whose come through Redis.
                return
            self._subtract(old)
        self.readings[node_reading.node_id] = node_reading
        for i, value in enumerate(node_reading[SUMMED]):
            self.sums[i] += value
        second = int(node_reading.received_at)
        node_ids = self.by_second.get(second)
        if node_ids is None:  # (not setdefault: a new set for every reading)
            node_ids = self.by_second[second] = set()
        node_ids.add(node_reading.node_id)
        self.heard.add(node_reading.node_id)

    def _subtract(self, node_reading):
        for i, value in enumerate(node_reading[SUMMED]):
            self.sums[i] -= value

    def expire(self, received_before):
        """Let go of the readings received before this time."""
        while self.by_second and (second := min(self.by_second)) < received_before:
            node_ids = self.by_second[second]
            whole = second + 1 <= received_before  # else the second turning stale now
            if whole:
                del self.by_second[second]
            for node_id in list(node_ids):
                current = self.readings.get(node_id)
                if current is not None and current.received_at < received_before:
                    self._subtract(current)
                    del self.readings[node_id]
                    node_ids.discard(node_id)
            if not whole:
                break
        if not self.readings:
            self.sums = list(NO_SUMS)  # exactly nothing, whatever the sums drifted to

    def usage(self):
        """Cluster-wide usage of the readings held; None when no GPU reports."""
        gpus, util_sum, util_count, used, total, net, sm_active_sum, sm_active_count = self.sums
        if not gpus:
            return None
        return {
            "gpus_reporting": gpus,
            "gpu_util_pct": util_sum / util_count if util_count else 0.0,
            "gpu_mem_used_pct": 100.0 * used / total if total > 0 else 0.0,
            "net_bps": net,
            # None where no GPU reports it (none has GPM: before Hopper)
            "gpu_sm_active_pct": sm_active_sum / sm_active_count if sm_active_count else None,
        }

    def take_heard(self):
        """{node id: received_at} of the nodes heard since the last call, still fresh."""
        heard, self.heard = self.heard, set()
        return {node_id: self.readings[node_id].received_at
                for node_id in heard if node_id in self.readings}

    def gpus_at_load(self):
        """[(node id, GPUs at load as GPU_AT_LOAD)] of the nodes with a GPU at load."""
        return [(r.node_id, r.at_load) for r in self.readings.values() if r.at_load]


class LiveFold:
    """The ClusterFold of every cluster."""

    def __init__(self):
        self.clusters = {}

    def add(self, cluster_id, node_reading):
        self.cluster(cluster_id).add(node_reading)

    def cluster(self, cluster_id):
        fold = self.clusters.get(cluster_id)
        if fold is None:
            fold = self.clusters[cluster_id] = ClusterFold()
        return fold


def minute_of(when):
    """The minute a datetime or a unix time falls in, as an aware datetime."""
    if not isinstance(when, datetime):
        when = datetime.fromtimestamp(when, tz=dt_timezone.utc)
    return when.replace(second=0, microsecond=0)


# A cluster's minute is kept as three numbers per metric in one list (nodes/rollups.py
# add_values): [total, count, peak] of each.
def empty_stats(metrics):
    return [0.0, 0, None] * len(metrics)


class MinuteStats:
    """The total, count and peak of each of `metrics` for each row (a GPU, or a node) over a
    minute, in flat numpy arrays (a row's metrics side by side) that grow as rows come."""

    def __init__(self, metrics):
        self.width = len(metrics)
        self.rows = 0
        self._columns = np.arange(self.width)
        self.totals, self.counts, self.peaks = np.zeros(0), np.zeros(0), np.zeros(0)
        self._grow(64)

    def new_row(self):
        if self.rows * self.width == len(self.totals):
            self._grow(2 * self.rows)
        self.rows += 1
        return self.rows - 1

    def _grow(self, rows):
        more = rows * self.width - len(self.totals)
        self.totals = np.concatenate([self.totals, np.zeros(more)])
        self.counts = np.concatenate([self.counts, np.zeros(more)])
        self.peaks = np.concatenate([self.peaks, np.full(more, -np.inf)])

    def add(self, rows, values, present):
        """Add `values` (a line per row of `rows`, which may repeat, and a column per metric)
        where `present` (no reading: False). In the order given, as adding them one by one
        would: the same totals, to the last bit."""
        at = (np.asarray(rows)[:, None] * self.width + self._columns).ravel()
        np.add.at(self.totals, at, np.where(present, values, 0.0).ravel())
        # As floats: ufunc.at takes some 40 times as long to add booleans to floats.
        np.add.at(self.counts, at, present.ravel().astype(float))
        np.maximum.at(self.peaks, at, np.where(present, values, -np.inf).ravel())

    def means_and_peaks(self, rows, metrics):
        """{metric: [mean, peak]} of each of `rows` ([None, None] where the minute had no
        reading of the metric)."""
        at = np.asarray(rows, dtype=np.intp)[:, None] * self.width + self._columns
        counts = self.counts[at]
        had = counts > 0
        means = np.divide(self.totals[at], counts, out=np.full(at.shape, np.nan), where=had)
        peaks = np.where(had, self.peaks[at], np.nan)
        return [{metric: [mean, peak] if mean == mean else [None, None]  # (NaN: no reading)
                 for metric, mean, peak in zip(metrics, row_means, row_peaks)}
                for row_means, row_peaks in zip(means.tolist(), peaks.tolist())]


class FinishedMinute(NamedTuple):
    """A NodeMinute's minute once it has ended, handed to the writer (nodes/rollups.py),
    which reads it in a worker thread: off the event loop, where the means of 2,000 nodes'
    GPUs would hold the samples up."""

    minute: datetime
    gpu_rows: dict  # node_id -> {gpu uuid: its row in gpu_stats}
    node_rows: dict  # node_id -> its row in node_stats
    gpu_stats: MinuteStats
    node_stats: MinuteStats

    def node_ids(self):
        return list(self.node_rows)

    def means_and_peaks(self, node_ids):
        """[(gpus, node)] of each of `node_ids`: gpus {uuid: {metric: [mean, peak]}} of
        GPU_METRICS, node {metric: [mean, peak]} of NODE_METRICS."""
        gpu_rows = [self.gpu_rows[node_id] for node_id in node_ids]
        gpu_values = iter(self.gpu_stats.means_and_peaks(
            [row for rows in gpu_rows for row in rows.values()], GPU_METRICS))
        nodes = self.node_stats.means_and_peaks([self.node_rows[node_id] for node_id in node_ids],
                                                NODE_METRICS)
        return [({uuid: next(gpu_values) for uuid in rows}, node)
                for rows, node in zip(gpu_rows, nodes)]


# A sample's GPU as NodeMinute.take_readings() reads it: GPU_METRICS, then the SM clock.
_gpu_values = attrgetter(*GPU_METRICS, "sm_clock_mhz")
_UTIL, _SM_ACTIVE, _MEM_USED = (GPU_METRICS.index(metric) for metric in
                                ("util_pct", "sm_active_pct", "mem_used_bytes"))
_SM_CLOCK = len(GPU_METRICS)
_uuid = attrgetter("uuid")


def _as_array(lines, width):
    """Lines of `width` numbers or None as a float array, None as NaN."""
    return np.array(list(chain.from_iterable(lines)), dtype=float).reshape(-1, width)


class NodeMinute:
    """Each node's minute of samples, taken in batches: add() keeps a sample, take_readings()
    (the live store's flush, every 50 ms) adds those kept since into the minute and returns
    their NodeReadings, and finish_if_new_minute() hands the minute back once it has ended.
    A batch is added up in numpy: per GPU and metric in Python, the minute was a fifth of
    the agent gateway's core (bench/README.md, "The node minute in numpy")."""

    def __init__(self):
        self.minute = None
        self._start_minute()
        self._start_batch()

    def _start_minute(self):
        self.gpu_rows = {}  # node_id -> {gpu uuid: its row in gpu_stats}
        self.node_rows = {}  # node_id -> its row in node_stats
        self.last_gpus = {}  # node_id -> (the uuids of its last sample's GPUs, their rows)
        self.gpu_stats = MinuteStats(GPU_METRICS)
        self.node_stats = MinuteStats(NODE_METRICS)

    def _start_batch(self):
        # Flat lists, not the samples: until the flush the batch holds no object the garbage
        # collector tracks but these lists (gateway.protocol's GPU and node readings are not
        # tracked), so thousands a second are not promoted into its oldest generation.
        self.cluster_ids, self.node_ids, self.received = [], [], []
        self.gpu_counts, self.gpus, self.mem_totals, self.nodes = [], [], [], []

    def add(self, cluster_id, sample):
        """Keep a LiveSample of `cluster_id` for the next take_readings()."""
        self.cluster_ids.append(cluster_id)
        self.node_ids.append(sample.node_id)
        self.received.append(sample.received_at)
        self.gpu_counts.append(len(sample.gpus))
        self.gpus += sample.gpus
        self.mem_totals += sample.mem_totals
        self.nodes.append(sample.node)

    def take_readings(self, min_util_pct):
        """Add the samples kept since the last call to their nodes' minute; [(cluster id,
        NodeReading)] of each, in the order added (a GPU at load: at min_util_pct or more)."""
        batch = (self.cluster_ids, self.node_ids, self.received, self.gpu_counts, self.gpus,
                 self.mem_totals, self.nodes)
        self._start_batch()
        cluster_ids, node_ids, received, gpu_counts, gpus, mem_totals, nodes = batch
        if not node_ids:
            return []
        if self.minute is None:
            self.minute = minute_of(received[0])
        gpu_values = _as_array(map(_gpu_values, gpus), len(GPU_METRICS) + 1)
        metrics = gpu_values[:, :_SM_CLOCK]
        present = ~np.isnan(metrics)
        self._add_to_minute(node_ids, gpu_counts, gpus, metrics, present, nodes)

        # Each sample's NodeReading: sums over its GPUs.
        samples = len(node_ids)
        sample_of_gpu = np.repeat(np.arange(samples), gpu_counts)

        def sums(weights):
            return np.bincount(sample_of_gpu, weights, samples).tolist()

        def counts(where):
            return np.bincount(sample_of_gpu[where], minlength=samples).tolist()

        filled = np.where(present, metrics, 0.0)
        totals = np.array(mem_totals, dtype=float)  # (a total is the hello's; None: not told)
        with_total = present[:, _MEM_USED] & (totals != 0) & (np.abs(totals) <= READING_MAX)
        at_load = np.flatnonzero((gpu_values[:, _UTIL] >= min_util_pct)
                                 & ~np.isnan(gpu_values[:, _SM_CLOCK]))
        bounds = np.searchsorted(at_load, np.cumsum([0, *gpu_counts])).tolist()
        gpus_at_load = [gpu_at_load(gpus[index]) for index in at_load.tolist()]
        readings = map(
            NodeReading, node_ids, received, gpu_counts,
            sums(filled[:, _UTIL]), counts(present[:, _UTIL]),
            sums(np.where(with_total, metrics[:, _MEM_USED], 0.0)),
            sums(np.where(with_total, totals, 0.0)),
            [(node.net_rx_bps or 0) + (node.net_tx_bps or 0) for node in nodes],
            sums(filled[:, _SM_ACTIVE]), counts(present[:, _SM_ACTIVE]),
            [tuple(gpus_at_load[first:last]) for first, last in zip(bounds, bounds[1:])])
        return list(zip(cluster_ids, readings))

    def _add_to_minute(self, node_ids, gpu_counts, gpus, metrics, present, nodes):
        gpu_rows = []
        start = 0
        for node_id, count in zip(node_ids, gpu_counts):
            gpu_rows += self._gpu_rows(node_id, gpus[start:start + count])
            start += count
        self.gpu_stats.add(gpu_rows, metrics, present)
        node_values = _as_array(map(_node_metric_values, nodes), len(NODE_METRICS))
        self.node_stats.add([self._node_row(node_id) for node_id in node_ids], node_values,
                            ~np.isnan(node_values))

    def _gpu_rows(self, node_id, gpus):
        """The rows of a sample's GPUs: those of the node's last sample when its GPUs are."""
        uuids = tuple(map(_uuid, gpus))
        last = self.last_gpus.get(node_id)
        if last is not None and last[0] == uuids:
            return last[1]
        rows_of = self.gpu_rows.setdefault(node_id, {})
        rows = []
        for uuid in uuids:
            row = rows_of.get(uuid)
            if row is None:
                row = rows_of[uuid] = self.gpu_stats.new_row()
            rows.append(row)
        self.last_gpus[node_id] = (uuids, rows)
        return rows

    def _node_row(self, node_id):
        row = self.node_rows.get(node_id)
        if row is None:
            row = self.node_rows[node_id] = self.node_stats.new_row()
        return row

    def finish_if_new_minute(self, now):
        """The FinishedMinute that ended before `now`, or None. Samples still in the batch
        go into the next minute, as do those received in its first second before the call
        (the publisher's, once a second)."""
        minute = minute_of(now)
        if self.minute is None:
            self.minute = minute
        if self.minute == minute:
            return None
        finished = FinishedMinute(self.minute, self.gpu_rows, self.node_rows, self.gpu_stats,
                                  self.node_stats)
        self.minute = minute
        self._start_minute()
        return finished


class ClusterMinute:
    """Each cluster's minute of the publisher's ticks (ClusterRollup)."""

    def __init__(self):
        self.minute = None
        self.clusters = {}  # cluster_id -> flat stats of CLUSTER_METRICS

    def add(self, cluster_id, usage, now):
        """Add one tick of one cluster; returns (minute, clusters) of the minute that just
        ended, if any."""
        minute = minute_of(now)
        finished = None
        if self.minute != minute:
            if self.minute is not None:
                finished = (self.minute, self.clusters)
            self.minute, self.clusters = minute, {}
        if usage is not None:
            stats = self.clusters.get(cluster_id)
            if stats is None:
                stats = self.clusters[cluster_id] = empty_stats(CLUSTER_METRICS)
            add_values(stats, usage, CLUSTER_METRICS)
        return finished
