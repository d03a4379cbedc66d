"""Per-minute rollups of the live samples (the minutes are kept in nodes/live_fold.py).

ClusterRollup: the cluster-wide usage for the overview chart, from the publisher's ticks.
NodeRollup: mean and max of each GPU metric per GPU, and the node's network, for the node
page's charts, from the node's samples. Each is written when its minute ends.
"""

import time
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from common.bulk_sql import column, insert_rows, one_of, select, table

from .models import ClusterRollup, Node, NodeRollup

GPU_METRICS = ("util_pct", "sm_active_pct", "mem_used_bytes", "temp_c", "power_w")
NODE_METRICS = ("net_rx_bps", "net_tx_bps", "cpu_pct")


# A reading beyond this is no measurement (a petabyte a second, 10^18 %) and is left out of
# sums and means: PROTOCOL.md lets any finite number through, and two near 1e308 add up to
# infinity, which neither PostgreSQL's jsonb nor a browser's JSON.parse takes.
READING_MAX = 1e18


def reading(value):
    """The value, or None when it is missing or beyond READING_MAX."""
    return value if value is not None and -READING_MAX <= value <= READING_MAX else None


def add_values(stats, record, metrics):
    """Add the values of `metrics` in the dict `record` to the flat list `stats`."""
    add_readings(stats, [reading(record.get(metric)) for metric in metrics])


def add_readings(stats, values):
    """Add `values` (one per metric, in the metrics' order; None: no reading), each within
    READING_MAX, to the flat list `stats`."""
    offset = 0
    for value in values:
        if value is not None:
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


CLUSTER_METRICS = ("gpus_reporting", "gpu_util_pct", "gpu_mem_used_pct", "net_bps",
                   "gpu_sm_active_pct")


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
            gpu_sm_active_pct=pairs["gpu_sm_active_pct"][0],
        ))
    return rows


def node_rollup_rows(minute, gpus, nodes, node_ids):
    """A finished minute's NodeRollup rows of `node_ids`: (node id, minute, gpus,
    node_metrics), as insert_rows() takes them."""
    return [
        (node_id, minute,
         {uuid: mean_and_peak(stats, GPU_METRICS) for uuid, stats in gpus[node_id].items()},
         mean_and_peak(nodes[node_id], NODE_METRICS))
        for node_id in node_ids
    ]


# The writer runs in a worker thread while the event loop ingests. Building and inserting
# 2,000 node rows holds the GIL whenever it runs; the event loop gives the GIL up at every
# socket call and then waits for it, so the frames of the second after each minute's end
# came 300-500 ms late (bench/README.md). In batches, with a pause after each, the writer
# leaves the loop most of the GIL. Each batch is one statement (common.bulk_sql): through
# the ORM's bulk_create, the minute of 2,000 nodes cost the process about a second of CPU.
WRITE_BATCH_ROWS = 250
WRITE_PAUSE_S = 0.01
NODE_ROLLUP_FIELDS = ("node", "minute", "gpus", "node_metrics")


def write_cluster_rollups(minute, clusters):
    """Write ClusterMinute's finished minute. A minute already written (another publisher)
    is kept."""
    ClusterRollup.objects.bulk_create(cluster_rollup_rows(minute, clusters),
                                      ignore_conflicts=True)


@transaction.atomic
def write_node_rollups(minute, gpus, nodes):
    """Write NodeMinute's finished minute, in one transaction. A node's minute already written
    (by another server process, where the node reconnected to it within the minute) is
    kept; a node removed within the minute is left out."""
    where, params = one_of(Node, "id", list(gpus))
    node_ids = sorted(node_id for (node_id,) in select(
        f"SELECT {column(Node, 'id')} FROM {table(Node)} WHERE {where}", params))
    for start in range(0, len(node_ids), WRITE_BATCH_ROWS):
        if start:
            time.sleep(WRITE_PAUSE_S)
        batch = node_ids[start:start + WRITE_BATCH_ROWS]
        insert_rows(NodeRollup, NODE_ROLLUP_FIELDS, node_rollup_rows(minute, gpus, nodes, batch),
                    conflict_do_nothing=True)


def prune_rollups(now=None):
    cutoff = (now or timezone.now()) - timedelta(days=settings.CLUSTERUI_ROLLUP_RETENTION_DAYS)
    clusters, _ = ClusterRollup.objects.filter(minute__lt=cutoff).delete()
    nodes, _ = NodeRollup.objects.filter(minute__lt=cutoff).delete()
    return clusters + nodes
