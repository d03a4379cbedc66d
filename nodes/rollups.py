"""Per-minute rollups, built from the live store once a second by the publisher.

ClusterRollup: the cluster-wide usage for the overview chart. NodeRollup: mean and max of
each GPU metric per GPU, and the node's network, for the node page's charts. Both are
written in one batch when a minute ends.
"""

from collections import defaultdict
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


def summarize_usage(entries):
    """Cluster-wide usage now, from fresh live entries; None when nothing reports."""
    utils, used, total, net, gpus = [], 0, 0, 0.0, 0
    for entry in entries:
        for gpu in entry["gpus"]:
            gpus += 1
            if gpu.get("util_pct") is not None:
                utils.append(gpu["util_pct"])
            if gpu.get("mem_used_bytes") is not None and gpu.get("mem_total_bytes"):
                used += gpu["mem_used_bytes"]
                total += gpu["mem_total_bytes"]
        node = entry["node"]
        net += (node.get("net_rx_bps") or 0) + (node.get("net_tx_bps") or 0)
    if not gpus:
        return None
    return {
        "gpus_reporting": gpus,
        "gpu_util_pct": sum(utils) / len(utils) if utils else 0.0,
        "gpu_mem_used_pct": 100.0 * used / total if total else 0.0,
        "net_bps": net,
    }


class Stat:
    __slots__ = ("total", "count", "peak")

    def __init__(self):
        self.total, self.count, self.peak = 0.0, 0, None

    def add(self, value):
        if value is None:
            return
        self.total += value
        self.count += 1
        self.peak = value if self.peak is None else max(self.peak, value)

    def pair(self):
        return [self.total / self.count, self.peak] if self.count else [None, None]


class RollupAccumulator:
    """Collects one minute of samples; hands back the finished minute's rows when it ends."""

    def __init__(self):
        self.minute = None
        self._reset()

    def _reset(self):
        self.clusters = defaultdict(lambda: defaultdict(Stat))
        self.gpus = defaultdict(lambda: defaultdict(lambda: defaultdict(Stat)))
        self.nodes = defaultdict(lambda: defaultdict(Stat))

    def add(self, cluster_id, usage, entries, now):
        """Add one tick of one cluster. Returns the rows of a minute that just ended, if any."""
        finished = self.finish_if_new_minute(now)
        if usage is not None:
            stats = self.clusters[cluster_id]
            for key in ("gpus_reporting", "gpu_util_pct", "gpu_mem_used_pct", "net_bps"):
                stats[key].add(usage[key])
        for entry in entries:
            node_gpus = self.gpus[entry["node_id"]]
            for gpu in entry["gpus"]:
                for metric in GPU_METRICS:
                    node_gpus[gpu["uuid"]][metric].add(gpu.get(metric))
            for metric in NODE_METRICS:
                self.nodes[entry["node_id"]][metric].add(entry["node"].get(metric))
        return finished

    def finish_if_new_minute(self, now):
        minute = now.replace(second=0, microsecond=0)
        if self.minute == minute:
            return None
        finished = self.rows() if self.minute is not None else None
        self.minute = minute
        self._reset()
        return finished

    def rows(self):
        clusters = [
            ClusterRollup(
                cluster_id=cluster_id, minute=self.minute,
                gpus_reporting=round(stats["gpus_reporting"].pair()[0] or 0),
                gpu_util_pct=stats["gpu_util_pct"].pair()[0] or 0.0,
                gpu_mem_used_pct=stats["gpu_mem_used_pct"].pair()[0] or 0.0,
                net_bps=stats["net_bps"].pair()[0] or 0.0,
            )
            for cluster_id, stats in self.clusters.items() if stats["gpus_reporting"].count
        ]
        nodes = [
            NodeRollup(
                node_id=node_id, minute=self.minute,
                gpus={uuid: {m: s[m].pair() for m in GPU_METRICS} for uuid, s in gpus.items()},
                node_metrics={m: self.nodes[node_id][m].pair() for m in NODE_METRICS},
            )
            for node_id, gpus in self.gpus.items()
        ]
        return clusters, nodes


@transaction.atomic
def write_rollups(cluster_rows, node_rows):
    """One batch per minute. A minute already written (another publisher) is kept."""
    ClusterRollup.objects.bulk_create(cluster_rows, ignore_conflicts=True)
    NodeRollup.objects.bulk_create(node_rows, ignore_conflicts=True, batch_size=500)


def prune_rollups(now=None):
    cutoff = (now or timezone.now()) - timedelta(days=settings.CLUSTERUI_ROLLUP_RETENTION_DAYS)
    clusters, _ = ClusterRollup.objects.filter(minute__lt=cutoff).delete()
    nodes, _ = NodeRollup.objects.filter(minute__lt=cutoff).delete()
    return clusters + nodes
