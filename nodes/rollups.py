"""Per-minute rollups, built from the live store once a second by the publisher.

ClusterRollup: the cluster-wide usage for the overview chart. NodeRollup: mean and max of
each GPU metric per GPU, and the node's network, for the node page's charts. Both are
written in one transaction when a minute ends.
"""

import time
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from .models import ClusterRollup, NodeRollup

GPU_METRICS = ("util_pct", "mem_used_bytes", "temp_c", "power_w")
NODE_METRICS = ("net_rx_bps", "net_tx_bps", "cpu_pct")


def fresh_entries(snapshot, now_ts, stale_after_s):
    """The snapshot's entries received within `stale_after_s` seconds of now_ts."""
    return [e for e in snapshot.values() if now_ts - e["received_at"] <= stale_after_s]


# A reading beyond this is no measurement (a petabyte a second, 10^18 %) and is left out of
# sums and means: PROTOCOL.md lets any finite number through, and two near 1e308 add up to
# infinity, which neither PostgreSQL's jsonb nor a browser's JSON.parse takes.
READING_MAX = 1e18


def reading(value):
    """The value, or None when it is missing or beyond READING_MAX."""
    return value if value is not None and -READING_MAX <= value <= READING_MAX else None


def summarize_usage(entries):
    """Cluster-wide usage now, from fresh live entries; None when nothing reports."""
    utils, used, total, net, gpus = [], 0, 0, 0.0, 0
    for entry in entries:
        for gpu in entry["gpus"]:
            gpus += 1
            if reading(gpu.get("util_pct")) is not None:
                utils.append(gpu["util_pct"])
            if reading(gpu.get("mem_used_bytes")) is not None and reading(
                    gpu.get("mem_total_bytes")):
                used += gpu["mem_used_bytes"]
                total += gpu["mem_total_bytes"]
        node = entry["node"]
        net += (reading(node.get("net_rx_bps")) or 0) + (reading(node.get("net_tx_bps")) or 0)
    if not gpus:
        return None
    return {
        "gpus_reporting": gpus,
        "gpu_util_pct": sum(utils) / len(utils) if utils else 0.0,
        "gpu_mem_used_pct": 100.0 * used / total if total else 0.0,
        "net_bps": net,
    }


# A metric's minute, kept as three numbers in a list shared by all of a GPU's (or a node's)
# metrics: [total, count, peak] at offset 3 * i for metric i. One list per GPU rather than an
# object per metric: the accumulator holds 20,000 objects for 2,000 nodes instead of 90,000,
# which the garbage collector walks (bench/README.md), and add() costs half as much.
EMPTY = (0.0, 0, None)


def add_values(stats, record, metrics):
    """Add the values of `metrics` in the dict `record` to the flat list `stats`."""
    offset = 0
    for metric in metrics:
        value = record.get(metric)
        if value is not None and -READING_MAX <= value <= READING_MAX:
            stats[offset] += value
            stats[offset + 1] += 1
            peak = stats[offset + 2]
            if peak is None or value > peak:
                stats[offset + 2] = value
        offset += 3


def mean_and_peak(stats, metrics):
    """{metric: [mean, peak]} of a flat list ([None, None] where the minute had no value)."""
    pairs = {}
    for i, metric in enumerate(metrics):
        total, count, peak = stats[3 * i: 3 * i + 3]
        pairs[metric] = [total / count, peak] if count else [None, None]
    return pairs


CLUSTER_METRICS = ("gpus_reporting", "gpu_util_pct", "gpu_mem_used_pct", "net_bps")


class RollupAccumulator:
    """Collects one minute of samples; hands back the finished minute when it ends."""

    def __init__(self):
        self.minute = None
        self._reset()

    def _reset(self):
        self.clusters = {}  # cluster_id -> flat stats of CLUSTER_METRICS
        self.gpus = {}  # node_id -> {gpu uuid: flat stats of GPU_METRICS}
        self.nodes = {}  # node_id -> flat stats of NODE_METRICS

    def add(self, cluster_id, usage, entries, now):
        """Add one tick of one cluster. Returns the minute that just ended, if any, as
        write_rollups' arguments."""
        finished = self.finish_if_new_minute(now)
        if usage is not None:
            stats = self.clusters.get(cluster_id)
            if stats is None:
                stats = self.clusters[cluster_id] = list(EMPTY * len(CLUSTER_METRICS))
            add_values(stats, usage, CLUSTER_METRICS)
        for entry in entries:
            node_id = entry["node_id"]
            node_gpus = self.gpus.get(node_id)
            if node_gpus is None:
                node_gpus = self.gpus[node_id] = {}
                self.nodes[node_id] = list(EMPTY * len(NODE_METRICS))
            for gpu in entry["gpus"]:
                stats = node_gpus.get(gpu["uuid"])
                if stats is None:
                    stats = node_gpus[gpu["uuid"]] = list(EMPTY * len(GPU_METRICS))
                add_values(stats, gpu, GPU_METRICS)
            add_values(self.nodes[node_id], entry["node"], NODE_METRICS)
        return finished

    def finish_if_new_minute(self, now):
        minute = now.replace(second=0, microsecond=0)
        if self.minute == minute:
            return None
        finished = ((self.minute, self.clusters, self.gpus, self.nodes)
                    if self.minute is not None else None)
        self.minute = minute
        self._reset()
        return finished


def cluster_rollup_rows(minute, clusters):
    """A finished minute's ClusterRollup rows (clusters whose GPUs reported)."""
    rows = []
    for cluster_id, stats in clusters.items():
        pairs = mean_and_peak(stats, CLUSTER_METRICS)
        if pairs["gpus_reporting"][0] is None:
            continue
        rows.append(ClusterRollup(
            cluster_id=cluster_id, minute=minute,
            gpus_reporting=round(pairs["gpus_reporting"][0] or 0),
            gpu_util_pct=pairs["gpu_util_pct"][0] or 0.0,
            gpu_mem_used_pct=pairs["gpu_mem_used_pct"][0] or 0.0,
            net_bps=pairs["net_bps"][0] or 0.0,
        ))
    return rows


def node_rollup_rows(minute, gpus, nodes, node_ids):
    """A finished minute's NodeRollup rows of `node_ids`."""
    return [
        NodeRollup(
            node_id=node_id, minute=minute,
            gpus={uuid: mean_and_peak(stats, GPU_METRICS) for uuid, stats in gpus[node_id].items()},
            node_metrics=mean_and_peak(nodes[node_id], NODE_METRICS),
        )
        for node_id in node_ids
    ]


# The writer runs in a worker thread while the event loop ingests. Building and inserting
# 2,000 node rows is a few hundred ms of Python, which holds the GIL whenever it runs; the
# event loop gives the GIL up at every socket call and then waits for it, so the frames of
# the second after each minute's end came 300-500 ms late (bench/README.md). In batches of
# 50 rows, with a pause after each, the writer leaves the loop most of the GIL; the minute
# takes about half a second to write.
WRITE_BATCH_ROWS = 50
WRITE_PAUSE_S = 0.01


@transaction.atomic
def write_rollups(minute, clusters, gpus, nodes):
    """Write RollupAccumulator.add()'s finished minute, in one transaction. A minute already
    written (another publisher) is kept."""
    ClusterRollup.objects.bulk_create(cluster_rollup_rows(minute, clusters),
                                      ignore_conflicts=True)
    node_ids = list(gpus)
    for start in range(0, len(node_ids), WRITE_BATCH_ROWS):
        if start:
            time.sleep(WRITE_PAUSE_S)
        batch = node_ids[start:start + WRITE_BATCH_ROWS]
        NodeRollup.objects.bulk_create(node_rollup_rows(minute, gpus, nodes, batch),
                                       ignore_conflicts=True)


def prune_rollups(now=None):
    cutoff = (now or timezone.now()) - timedelta(days=settings.CLUSTERUI_ROLLUP_RETENTION_DAYS)
    clusters, _ = ClusterRollup.objects.filter(minute__lt=cutoff).delete()
    nodes, _ = NodeRollup.objects.filter(minute__lt=cutoff).delete()
    return clusters + nodes
