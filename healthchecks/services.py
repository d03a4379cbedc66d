"""Writes for health events. Opening or closing one refreshes its node's state."""

from django.db import transaction
from django.utils import timezone

from nodes.states import refresh_node_state

from .choices import Source
from .models import HealthEvent


@transaction.atomic
def do_record_health_event(
    node, *, signature, severity, message="", gpu=None, evidence=None,
    source=Source.PASSIVE, count=1, now=None,
):
    """Open an event, or raise the count of the open one with the same (node, GPU, signature)."""
    now = now or timezone.now()
    event = (
        HealthEvent.objects.open()
        .select_for_update()
        .filter(node=node, gpu=gpu, signature=signature)
        .first()
    )
    if event is not None:
        HealthEvent.objects.filter(pk=event.pk).update(
            count=event.count + count, last_seen=now, message=message or event.message
        )
        event.refresh_from_db()
        return event
    event = HealthEvent.objects.create(
        node=node, gpu=gpu, signature=signature, severity=severity, source=source,
        message=message, evidence=evidence or {}, first_seen=now, last_seen=now, count=count,
    )
    refresh_node_state(node, reason=f"{signature} opened", now=now)
    return event


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
