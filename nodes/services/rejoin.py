"""Opening a node, or its whole cluster, to re-join (PROTOCOL.md)."""

from datetime import datetime

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone

from clusters.models import Cluster
from clusters.services import record_audit

from ..models import Node
from ..states import note_on_timeline


# Re-join (PROTOCOL.md): a join-token hello naming an existing node re-registers it only
# while the node, or its whole cluster, is open to re-join.
REJOIN_MAX_HOURS = 72
REPAIR_OPENER = "repair #{}"  # rejoin_opened_by of a repair's opening, which lasts until it ends


def opened_by_a_repair(node):
    return node.rejoin_opened_by.startswith(REPAIR_OPENER.format(""))


def rejoin_opening(node, now):
    """Why the node is open to re-join now ("opened by alice until 14:05 UTC"), or None."""
    for opened in (node, node.cluster):
        if opened.rejoin_open_until is not None and opened.rejoin_open_until > now:
            what = "" if opened is node else "the whole cluster "
            return (f"{what}opened by {opened.rejoin_opened_by} until "
                    f"{opened.rejoin_open_until:%Y-%m-%d %H:%M} UTC")
    return None


@transaction.atomic
def do_open_rejoin(node: Node, *, by, until, actor: AbstractBaseUser | None = None,
                   request: HttpRequest | None = None, now: datetime | None = None) -> None:
    """Open the node to re-join until `until`; `by` says who (a user name, "repair #12")."""
    now = now or timezone.now()
    Node.objects.filter(pk=node.pk).update(rejoin_open_until=until, rejoin_opened_by=by)
    node.rejoin_open_until, node.rejoin_opened_by = until, by
    note_on_timeline(node, f"open to re-join until {until:%Y-%m-%d %H:%M} UTC ({by})",
                     actor=actor, now=now)
    record_audit(actor, "node.rejoin_open", node, cluster=node.cluster, request=request, now=now,
                 changes={"until": until.isoformat(), "by": by})


@transaction.atomic
def do_close_rejoin(node: Node, *, actor: AbstractBaseUser | None = None, opened_by=None, reason,
                    request: HttpRequest | None = None, now: datetime | None = None) -> bool:
    """Close the node to re-join (only when `opened_by` opened it, if given). True if it was
    open."""
    now = now or timezone.now()
    opened = Node.objects.filter(pk=node.pk, rejoin_open_until__isnull=False)
    if opened_by is not None:
        opened = opened.filter(rejoin_opened_by=opened_by)
    if not opened.update(rejoin_open_until=None, rejoin_opened_by=""):
        return False
    node.rejoin_open_until, node.rejoin_opened_by = None, ""
    note_on_timeline(node, f"closed to re-join: {reason}", actor=actor, now=now)
    record_audit(actor, "node.rejoin_close", node, cluster=node.cluster, request=request, now=now,
                 changes={"reason": reason})
    return True


@transaction.atomic
def do_open_cluster_rejoin(cluster: Cluster, *, actor: AbstractBaseUser, until,
                           request: HttpRequest | None = None, now: datetime | None = None) -> None:
    """Open every node of the cluster to re-join until `until` (a migration)."""
    Cluster.objects.filter(pk=cluster.pk).update(
        rejoin_open_until=until, rejoin_opened_by=actor.get_username())
    record_audit(actor, "cluster.rejoin_open", cluster, cluster=cluster, request=request, now=now,
                 changes={"until": until.isoformat()})


@transaction.atomic
def do_close_cluster_rejoin(cluster: Cluster, *, actor: AbstractBaseUser,
                            request: HttpRequest | None = None,
                            now: datetime | None = None) -> bool:
    if not Cluster.objects.filter(pk=cluster.pk, rejoin_open_until__isnull=False).update(
            rejoin_open_until=None, rejoin_opened_by=""):
        return False
    record_audit(actor, "cluster.rejoin_close", cluster, cluster=cluster, request=request, now=now)
    return True
