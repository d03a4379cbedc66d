"""The live samples, folded in as they are recorded: what the publisher's tick needs, at a
cost per sample instead of a cost per node every second.

The tick used to decode every node's latest entry each second and add them all up: for
2,000 nodes, 40 % of a core before any sample arrived (bench/README.md, 2026-12-02). Now a
sample is reduced when it is recorded (nodes/live_store.py):
- to a NodeReading: its usage as a few numbers, and its GPUs at load (the slow GPU rule
  compares only those). A ClusterFold keeps each node's latest reading with running sums,
  and lets a reading go when it turns stale: the tick reads the sums, the nodes heard since
  the last tick (last_seen) and the GPUs at load;
- into a NodeMinute: each node's minute of GPU and node metrics, written as NodeRollup rows
  when the minute ends.

In embedded mode the one process folds its own samples. In production the publisher's leader
folds every process's samples, which the others send it through Redis (nodes/live_store.py),
and writes the fleet's minutes.
"""

from datetime import datetime, timezone as dt_timezone
from operator import attrgetter
from typing import NamedTuple

from .rollups import (CLUSTER_METRICS, GPU_METRICS, NODE_METRICS, add_readings, add_values,
                      reading)


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
_gpu_metric_values = attrgetter(*GPU_METRICS)
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
                # whose samples are folded at once, from one whose come through Redis.
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


# A metric's minute is kept as three numbers in a list shared by all of a GPU's (or a
# node's) metrics (nodes/rollups.py add_values): one list per GPU, not an object per metric.
def empty_stats(metrics):
    return [0.0, 0, None] * len(metrics)


# Where NodeMinute.add finds the NodeReading's metrics among a GPU's GPU_METRICS values.
_UTIL, _SM_ACTIVE, _MEM_USED = (GPU_METRICS.index(metric) for metric in
                                ("util_pct", "sm_active_pct", "mem_used_bytes"))


class NodeMinute:
    """Each node's minute of samples; hands back the minute when it has ended. Each sample
    added also gives its NodeReading: the live store records both from one pass."""

    def __init__(self):
        self.minute = None
        self.gpus = {}  # node_id -> {gpu uuid: flat stats of GPU_METRICS}
        self.nodes = {}  # node_id -> flat stats of NODE_METRICS

    def add(self, sample, min_util_pct):
        """Add a LiveSample to its node's minute; returns its NodeReading, made in the same
        pass over its GPUs (the slow GPU rule keeps those at min_util_pct or more)."""
        if self.minute is None:
            self.minute = minute_of(sample.received_at)
        node_id = sample.node_id
        node_gpus = self.gpus.get(node_id)
        if node_gpus is None:
            node_gpus = self.gpus[node_id] = {}
            self.nodes[node_id] = empty_stats(NODE_METRICS)
        util_sum, util_count, used, total, at_load = 0.0, 0, 0, 0, []
        sm_active_sum, sm_active_count = 0.0, 0
        for gpu, gpu_total in zip(sample.gpus, sample.mem_totals):
            values = _gpu_metric_values(gpu)
            stats = node_gpus.get(gpu.uuid)
            if stats is None:
                stats = node_gpus[gpu.uuid] = empty_stats(GPU_METRICS)
            add_readings(stats, values)
            util, sm_active, gpu_used = values[_UTIL], values[_SM_ACTIVE], values[_MEM_USED]
            if util is not None:
                util_sum += util
                util_count += 1
                if util >= min_util_pct and gpu.sm_clock_mhz is not None:
                    at_load.append(gpu_at_load(gpu))
            if sm_active is not None:
                sm_active_sum += sm_active
                sm_active_count += 1
            if gpu_used is not None and reading(gpu_total):  # (a total is the hello's)
                used += gpu_used
                total += gpu_total
        node = sample.node
        add_readings(self.nodes[node_id], _node_metric_values(node))
        net = (node.net_rx_bps or 0) + (node.net_tx_bps or 0)
        return NodeReading(node_id, sample.received_at, len(sample.gpus), util_sum, util_count,
                           used, total, net, sm_active_sum, sm_active_count, tuple(at_load))

    def finish_if_new_minute(self, now):
        """(minute, gpus, nodes) of the minute that ended before `now`, or None."""
        minute = minute_of(now)
        if self.minute is None:
            self.minute = minute
        if self.minute == minute:
            return None
        finished = (self.minute, self.gpus, self.nodes)
        self.minute, self.gpus, self.nodes = minute, {}, {}
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
