"""Maintenance windows (nodes.models.MaintenanceWindow): which are on now, for which nodes.

The repairs (no recommendation, no start), health events (marked) and notifications (held
for a summary) of a node in maintenance ask here; so does the overview.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from cronsim import CronSim, CronSimError
from django.db.models import Q
from django.utils import timezone

from .models import MaintenanceWindow


@dataclass(frozen=True)
class Occurrence:
    window: MaintenanceWindow
    start: datetime
    end: datetime | None  # None: until someone ends the window
    node_ids: frozenset  # the nodes it covers, unless it covers the whole cluster

    def covers(self, node_id):
        return self.whole_cluster or node_id in self.node_ids

    @property
    def whole_cluster(self):
        return self.window.whole_cluster


def cron_problem(expression):
    """Why `expression` is not a cron expression cronsim reads, or None."""
    try:
        CronSim(expression, timezone.now())
    except CronSimError as exc:
        return str(exc)
    return None


def occurrence_at(window, now):
    """(start, end) of the window's occurrence that `now` falls in, or None."""
    if window.ended_at is not None and window.ended_at <= now:
        return None
    if now < window.starts_at or (window.ends_at is not None and now >= window.ends_at):
        return None
    if not window.cron:
        return window.starts_at, window.ends_at
    length = timedelta(minutes=window.duration_minutes or 0)
    start = next(CronSim(window.cron, max(window.starts_at, now - length)
                         - timedelta(seconds=1)))
    return (start, start + length) if start <= now < start + length else None


def current(cluster_ids, now=None):
    """The occurrences on now for the clusters (with their nodes), by cluster id."""
    now = now or timezone.now()
    windows = (MaintenanceWindow.objects.filter(cluster_id__in=cluster_ids, starts_at__lte=now)
               .filter(Q(ends_at__isnull=True) | Q(ends_at__gt=now))
               .filter(Q(ended_at__isnull=True) | Q(ended_at__gt=now))
               .prefetch_related("nodes"))
    found = {}
    for window in windows:
        times = occurrence_at(window, now)
        if times is not None:
            found.setdefault(window.cluster_id, []).append(Occurrence(
                window, *times, frozenset(node.pk for node in window.nodes.all())))
    return found


def occurrence_for(node, now=None, occurrences=None):
    """The occurrence a node is in maintenance by, or None (`occurrences`: current()'s, to
    ask for many nodes with one read)."""
    if occurrences is None:
        occurrences = current([node.cluster_id], now)
    return covering(occurrences, node.cluster_id, node.pk)


def covering(occurrences, cluster_id, node_id):
    """Of current()'s occurrences, the one a node is in maintenance by, or None."""
    for occurrence in occurrences.get(cluster_id, []):
        if occurrence.covers(node_id):
            return occurrence
    return None


def describe(occurrence):
    until = (f"until {timezone.localtime(occurrence.end):%Y-%m-%d %H:%M}"
             if occurrence.end else "until it is ended")
    return f"maintenance window #{occurrence.window.pk} ({occurrence.window.reason}), {until}"
