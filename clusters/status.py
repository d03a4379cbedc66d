"""A cluster's status: the one function that decides it, and the one that writes it.

DESIGN.md "Cluster status", the first that holds wins:

    paused        an open-ended whole-cluster maintenance window is on
    provisioning  no node has joined yet
    accepting     acceptance tests are on, and some joined node has not passed its battery
                  (a node an operator paused no longer holds the cluster back)
    degraded      paused and unhealthy nodes over the cluster's threshold
    ready         none of the above

The facts belong to nodes and maintenance windows, which sit above this package:
nodes.cluster_status reads them and hands them down to refresh_cluster_status(), as a
node's handed-down facts reach nodes.states. Nothing else assigns Cluster.status, and each
change is a ClusterTransition row on the cluster's timeline.
"""

from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from .models import Cluster, ClusterTransition
from .services import actor_name

Status = Cluster.Status


@dataclass(frozen=True)
class ClusterFacts:
    pause_reason: str = ""  # an open-ended whole-cluster maintenance window's, while it is on
    nodes: int = 0
    joined: int = 0  # nodes whose agent has said hello
    acceptance_on: bool = False
    to_accept: int = 0  # joined nodes that acceptance holds (not paused by an operator)
    accepted: int = 0  # of those, the ones that passed since they joined
    out_of_service: int = 0  # paused and unhealthy nodes


def compute_status(facts, degraded_threshold_pct):
    """(status, reason) for a cluster with these facts. Pure: no database, no clock."""
    if facts.pause_reason:
        return Status.PAUSED, f"maintenance: {facts.pause_reason}"
    if facts.joined == 0:
        registered = f" ({facts.nodes} registered)" if facts.nodes else ""
        return Status.PROVISIONING, f"no node has joined yet{registered}"
    if facts.acceptance_on and facts.accepted < facts.to_accept:
        return (Status.ACCEPTING,
                f"{facts.accepted} of {facts.to_accept} joined nodes passed acceptance")
    if facts.out_of_service * 100 > facts.nodes * degraded_threshold_pct:
        return (Status.DEGRADED, f"{facts.out_of_service} of {facts.nodes} nodes out of service, "
                                 f"over the {degraded_threshold_pct} % threshold")
    return Status.READY, ""


def refresh_cluster_status(cluster_id, facts, *, actor=None, now=None):
    """Recompute the cluster's status from `facts`; on a change, write it with a timeline row.
    Returns True when the status changed.

    No lock is taken: the write is a compare-and-set on the status read, so of two refreshes
    racing to the same change one writes it and its row; the other finds nothing to do."""
    now = now or timezone.now()
    current = (Cluster.objects.filter(pk=cluster_id)
               .values("status", "status_reason", "degraded_threshold_pct").first())
    if current is None:
        return False
    status, reason = compute_status(facts, current["degraded_threshold_pct"])
    reason = reason[:255]
    if status == current["status"]:
        if reason != current["status_reason"]:
            Cluster.objects.filter(pk=cluster_id, status=status).update(status_reason=reason)
        return False
    with transaction.atomic():
        changed = Cluster.objects.filter(pk=cluster_id, status=current["status"]).update(
            status=status, status_reason=reason, status_changed_at=now)
        if changed:
            ClusterTransition.objects.create(
                cluster_id=cluster_id, from_status=current["status"], to_status=status,
                reason=reason, actor_name=actor_name(actor), at=now)
    return bool(changed)
