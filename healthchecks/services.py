"""Writes for health events. Opening or closing one refreshes its node's state."""

from django.db import IntegrityError, transaction
from django.db.models import F, Value
from django.db.models.functions import Greatest
from django.utils import timezone

from nodes.states import refresh_node_state

from .choices import Source
from .models import HealthEvent


@transaction.atomic
def do_record_health_event(
    node, *, signature, severity, message="", gpu=None, evidence=None,
    source=Source.PASSIVE, count=1, now=None,
):
    """Open an event, or raise the count of the open one with the same (node, GPU, signature).

    Safe under concurrency: the database allows one open event per (node, GPU, signature),
    and a signal that loses the race to open it counts on the winner's event.
    """
    now = now or timezone.now()
    same = HealthEvent.objects.open().filter(node=node, gpu=gpu, signature=signature)
    changes = {"count": F("count") + count, "last_seen": Greatest("last_seen", Value(now))}
    if message:
        changes["message"] = message
    for _ in range(2):
        if same.update(**changes):
            return same.get()
        try:
            with transaction.atomic():
                event = HealthEvent.objects.create(
                    node=node, gpu=gpu, signature=signature, severity=severity, source=source,
                    message=message, evidence=evidence or {}, first_seen=now, last_seen=now,
                    count=count,
                )
        except IntegrityError:
            continue  # opened a moment ago by another worker: count on that one
        refresh_node_state(node, reason=f"{signature} opened", now=now)
        return event
    raise RuntimeError(f"cannot record {signature} on {node}: the open event keeps changing")


@transaction.atomic
def do_close_health_event(event, *, reason, actor=None, now=None):
    now = now or timezone.now()
    closed = HealthEvent.objects.filter(pk=event.pk, closed_at__isnull=True).update(
        closed_at=now, closed_reason=reason[:255]
    )
    if closed:
        refresh_node_state(event.node, actor=actor, reason=f"{event.signature} closed: {reason}",
                           now=now)
    event.refresh_from_db()
    return bool(closed)
