"""Maintenance windows: making, changing and ending them."""

from datetime import datetime

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone

from clusters.models import Cluster
from clusters.services import actor_name, record_audit

from ..cluster_status import refresh_cluster_statuses
from ..models import MaintenanceWindow


@transaction.atomic
def do_create_maintenance_window(cluster: Cluster, *, reason, starts_at, ends_at=None, cron="",
                                 duration_minutes=None, nodes=(), actor: AbstractBaseUser,
                                 request: HttpRequest | None = None,
                                 now: datetime | None = None) -> MaintenanceWindow:
    """A maintenance window over `nodes` of the cluster (none: the whole cluster)."""
    now = now or timezone.now()
    window = MaintenanceWindow.objects.create(
        cluster=cluster, whole_cluster=not nodes, reason=reason, starts_at=starts_at,
        ends_at=ends_at, cron=cron, duration_minutes=duration_minutes, created_at=now,
        created_by_name=actor_name(actor))
    window.nodes.set(nodes)
    record_audit(actor, "maintenance.create", window, cluster=cluster, request=request, now=now,
                 changes=_window_fields(window))
    refresh_cluster_statuses([cluster.pk], actor=actor, now=now)
    return window


@transaction.atomic
def do_update_maintenance_window(window, *, reason, ends_at, actor: AbstractBaseUser,
                                 request: HttpRequest | None = None,
                                 now: datetime | None = None) -> list[str]:
    """Change a window's reason or its end. Returns the fields changed."""
    now = now or timezone.now()
    window = MaintenanceWindow.objects.select_for_update().get(pk=window.pk)
    changes = {field: {"before": _when(getattr(window, field)), "after": _when(value)}
               for field, value in (("reason", reason), ("ends_at", ends_at))
               if getattr(window, field) != value}
    if changes:
        window.reason, window.ends_at = reason, ends_at
        window.save(update_fields=["reason", "ends_at"])
        record_audit(actor, "maintenance.update", window, cluster=window.cluster,
                     request=request, now=now, changes=changes)
        refresh_cluster_statuses([window.cluster_id], actor=actor, now=now)
    return list(changes)


@transaction.atomic
def do_end_maintenance_window(window, *, actor: AbstractBaseUser,
                              request: HttpRequest | None = None,
                              now: datetime | None = None) -> bool:
    """End a window now (its current occurrence and any to come)."""
    now = now or timezone.now()
    ended = MaintenanceWindow.objects.filter(pk=window.pk, ended_at__isnull=True).update(
        ended_at=now, ended_by_name=actor_name(actor))
    if ended:
        record_audit(actor, "maintenance.end", window, cluster=window.cluster, request=request,
                     now=now, changes={"reason": window.reason})
        refresh_cluster_statuses([window.cluster_id], actor=actor, now=now)
    return bool(ended)


def _when(value):
    return value.isoformat() if hasattr(value, "isoformat") else value


def _window_fields(window):
    return {"reason": window.reason, "starts_at": _when(window.starts_at),
            "ends_at": _when(window.ends_at), "cron": window.cron,
            "duration_minutes": window.duration_minutes,
            "nodes": "the whole cluster" if window.whole_cluster
            else sorted(node.name for node in window.nodes.all())}
