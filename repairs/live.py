"""Open Repair tabs and node pages hear "repair.changed" when a repair of their cluster
moves (a status, a step): at most one message a second per cluster (per process)."""

from django.db import transaction

from clusterui.realtime import Throttle

repair_changes = Throttle(interval_s=1.0)


def announce_repair_change(cluster):
    """Once the transaction commits (not at all if it rolls back)."""
    from nodes.publisher import cluster_group

    slug = cluster.slug
    transaction.on_commit(
        lambda: repair_changes.broadcast(cluster_group(slug), "repair.changed", cluster=slug),
        robust=True,
    )
