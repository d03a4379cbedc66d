"""The facts a cluster's status is decided from (clusters.status), read from its nodes and
maintenance windows and handed down: two queries for any number of clusters.

Called where those facts change: a node's state (nodes.states), a node removed, a
maintenance window created or ended, the cluster's settings saved; and every 10 s by the
beat (refresh-node-states), for windows that start or end with the clock."""

from django.db import transaction
from django.db.models import Count, F, Q
from django.utils import timezone

from clusters.models import Cluster
from clusters.status import ClusterFacts, refresh_cluster_status

from .choices import OUT_OF_SERVICE
from .models import MaintenanceWindow

# Asked of a cluster's nodes through Cluster's `nodes`.
JOINED = Q(nodes__last_hello_at__isnull=False)
TO_ACCEPT = JOINED & Q(nodes__acceptance_required=True, nodes__paused=False)


def read_cluster_facts(cluster_ids=None, now=None):
    """{cluster_id: ClusterFacts} for the clusters (every cluster when None)."""
    now = now or timezone.now()
    clusters = Cluster.objects.all()
    if cluster_ids is not None:
        clusters = clusters.filter(pk__in=list(cluster_ids))
    counts = {row["pk"]: row for row in clusters.values("pk", "acceptance_tests_enabled").annotate(
        node_count=Count("nodes"),
        joined=Count("nodes", filter=JOINED),
        to_accept=Count("nodes", filter=TO_ACCEPT),
        accepted=Count("nodes", filter=TO_ACCEPT & Q(
            nodes__acceptance_passed_at__gte=F("nodes__joined_at"))),
        out_of_service=Count("nodes", filter=Q(nodes__state__in=OUT_OF_SERVICE)),
    )}
    pauses = {}
    for window in (MaintenanceWindow.objects
                   .filter(cluster_id__in=list(counts), whole_cluster=True, cron="",
                           ends_at__isnull=True, starts_at__lte=now)
                   .filter(Q(ended_at__isnull=True) | Q(ended_at__gt=now))
                   .order_by("starts_at", "pk").only("cluster_id", "reason")):
        pauses.setdefault(window.cluster_id, window.reason or f"window #{window.pk}")
    return {cluster_id: ClusterFacts(
        pause_reason=pauses.get(cluster_id, ""), nodes=row["node_count"], joined=row["joined"],
        acceptance_on=row["acceptance_tests_enabled"], to_accept=row["to_accept"],
        accepted=row["accepted"], out_of_service=row["out_of_service"])
        for cluster_id, row in counts.items()}


def refresh_cluster_statuses(cluster_ids=None, *, actor=None, now=None):
    """Recompute the clusters' statuses (every cluster when None). Returns the ids whose
    status changed."""
    now = now or timezone.now()
    return {cluster_id for cluster_id, facts in read_cluster_facts(cluster_ids, now).items()
            if refresh_cluster_status(cluster_id, facts, actor=actor, now=now)}


def refresh_cluster_statuses_after_commit(cluster_ids, *, actor=None, now=None):
    """refresh_cluster_statuses once the caller's transaction commits (at once outside one).

    For the hot paths, a join or an event batch: every node of a cluster shares the
    cluster's row, and a status written inside a join's transaction keeps it locked until
    that join commits, so that concurrent joins take turns (while a cluster is accepting,
    each join changes its "n of N joined"). Written after, each lock lasts one statement,
    and the facts read include the caller's own changes. A refresh that fails is logged,
    and the beat's refresh (every 10 s) puts it right."""
    cluster_ids = set(cluster_ids)
    transaction.on_commit(
        lambda: refresh_cluster_statuses(cluster_ids, actor=actor, now=now), robust=True)
