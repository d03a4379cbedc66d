"""The change feed (DESIGN.md "Data flow"): services append, readers read.

A service that changes something a person or another part of the system must react to
calls record_change() in its own transaction, so the row exists exactly when the change
does. Readers never import the writers; each reads with read_changes(reader), which
returns the rows that reader has not seen yet.

PostgreSQL hands out ids before commit: a transaction that commits late shows an id below
rows already read. A bare "id > cursor" would skip it for ever, so each reader also keeps
the ids it found missing below its cursor (its gaps) and reads them again until they
appear, or until GAP_FORGOTTEN_AFTER_S says that transaction rolled back. (A reader's very
first read starts at the oldest row it finds: what is missing below that is history.)
"""

import time
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from common.bulk_sql import insert_rows

from .models import Change, FeedCursor

Kind = Change.Kind

# Longer than any transaction that appends a change may stay open.
GAP_FORGOTTEN_AFTER_S = 120.0
# At most this many missing ids are remembered (a rolled-back batch leaves a hole of ids).
MAX_GAPS = 10_000
READ_LIMIT = 10_000


@dataclass(frozen=True)
class ChangeRow:
    id: int
    kind: str
    cluster_id: int
    node_id: int | None
    object_id: str


def record_change(kind, *, cluster_id, node_id=None, object_id="", now=None):
    """Append one change row, in the caller's transaction."""
    Change.objects.create(kind=kind, cluster_id=cluster_id, node_id=node_id,
                          object_id=str(object_id), at=now or timezone.now())


def record_changes(kind, rows, *, now=None):
    """One change row per (cluster_id, node_id, object_id) of `rows`, in the caller's
    transaction."""
    record_changes_of_kinds([(kind, *row) for row in rows], now=now)


def record_changes_of_kinds(rows, *, now=None):
    """One change row per (kind, cluster_id, node_id, object_id) of `rows`, in the caller's
    transaction: one statement."""
    at = now or timezone.now()
    insert_rows(Change, ("kind", "cluster", "node_id", "object_id", "at"),
                [(kind, cluster_id, node_id, str(object_id), at)
                 for kind, cluster_id, node_id, object_id in rows])


def record_node_changes(kind, *, cluster_id, node_ids, now=None):
    """One change row per node, in the caller's transaction."""
    record_changes(kind, [(cluster_id, node_id, "") for node_id in node_ids], now=now)


def read_changes(reader, *, limit=READ_LIMIT, clock=time.time):
    """The changes `reader` has not read yet, oldest first; its cursor moves past them.

    The cursor moves by a conditional update (compare and set on its version): of two
    readers of one name reading at once, one gets the rows and the other none. Nothing is
    locked while the rows are read, so a reader never holds two tables at once. Called
    inside the transaction that does the reader's work, a rollback hands the same rows out
    again."""
    cursor, _ = FeedCursor.objects.get_or_create(reader=reader)
    gaps = {int(change_id): since for change_id, since in cursor.gaps.items()}
    unread = Q(id__gt=cursor.last_id)
    if gaps:
        unread |= Q(id__in=list(gaps))
    rows = [ChangeRow(*values) for values in Change.objects.filter(unread).order_by("id")
            .values_list("id", "kind", "cluster_id", "node_id", "object_id")[:limit]]
    now_ts = clock()
    read_ids = {row.id for row in rows}
    newest = max(read_ids, default=cursor.last_id)
    if newest > cursor.last_id:
        # A reader's first read starts at the oldest row there is: the ids below it were
        # pruned or flushed long ago, not handed to a transaction still open.
        start = cursor.last_id + 1 if cursor.last_id else min(read_ids)
        first_missing = max(start, newest - MAX_GAPS)
        for change_id in range(first_missing, newest):
            if change_id not in read_ids:
                gaps[change_id] = now_ts
    gaps = {change_id: since for change_id, since in gaps.items()
            if change_id not in read_ids and now_ts - since < GAP_FORGOTTEN_AFTER_S}
    if len(gaps) > MAX_GAPS:
        gaps = dict(sorted(gaps.items())[-MAX_GAPS:])
    moved = FeedCursor.objects.filter(pk=reader, version=cursor.version).update(
        version=F("version") + 1, last_id=max(newest, cursor.last_id),
        gaps={str(k): v for k, v in gaps.items()}, read_at=timezone.now())
    return rows if moved else []


def prune_changes(now=None):
    """Rows older than CLUSTERUI_CHANGE_RETENTION_DAYS go, but never one a reader has not
    read yet (past its cursor, or in its gaps): a reader stopped for longer than the
    retention finds its changes when it comes back. Returns how many."""
    now = now or timezone.now()
    cutoff = now - timedelta(days=settings.CLUSTERUI_CHANGE_RETENTION_DAYS)
    old = Change.objects.filter(at__lt=cutoff)
    unread_from = [min([cursor.last_id + 1, *map(int, cursor.gaps)])
                   for cursor in FeedCursor.objects.all()]
    if unread_from:
        old = old.filter(id__lt=min(unread_from))
    deleted, _ = old.delete()
    return deleted
