"""Writes for health events. Opening or closing one refreshes its node's state."""

from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models import F, Value
from django.db.models.functions import Greatest
from django.utils import timezone

from nodes.states import refresh_node_state

from clusterui.realtime import Throttle
from clusterui.services import record_audit

from .choices import Severity, Source
from .models import HealthEvent, Silence


# Open Health checks tabs refresh their table on "health.changed". An Xid storm counts on one
# event thousands of times a second: at most one message a second per cluster (per process).
health_changes = Throttle(interval_s=1.0)


def announce_health_change(node):
    """Once the transaction commits, the open Health checks tabs of the node's cluster hear
    that its health events changed (not at all if it rolls back)."""
    from nodes.publisher import cluster_group  # here: the publisher imports health services

    slug = node.cluster.slug
    transaction.on_commit(
        lambda: health_changes.broadcast(cluster_group(slug), "health.changed", cluster=slug),
        robust=True,  # committed is committed: a channel layer down loses only the live update
    )


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
    announce_health_change(node)
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
        closed_at=now, closed_reason=reason[:255], closed_by=actor
    )
    if closed:
        refresh_node_state(event.node, actor=actor, reason=f"{event.signature} closed: {reason}",
                           now=now)
        announce_health_change(event.node)
    event.refresh_from_db()
    return bool(closed)


@transaction.atomic
def do_acknowledge_event(event, *, actor, request=None, now=None):
    """A person knows about it: the event stays open, marked with who and when."""
    now = now or timezone.now()
    done = HealthEvent.objects.filter(
        pk=event.pk, closed_at__isnull=True, acknowledged_at__isnull=True
    ).update(acknowledged_by=actor, acknowledged_at=now)
    if done:
        record_audit(actor, "healthevent.acknowledge", event, cluster=event.node.cluster,
                     request=request, now=now)
        announce_health_change(event.node)
    event.refresh_from_db()
    return bool(done)


@transaction.atomic
def do_resolve_event(event, *, actor, comment, request=None, now=None):
    """An operator closes an event by hand, saying why (DESIGN.md: edge signals need it)."""
    now = now or timezone.now()
    closed = do_close_health_event(
        event, reason=f"resolved by {actor.get_username()}: {comment}", actor=actor, now=now)
    if closed:
        record_audit(actor, "healthevent.resolve", event, changes={"comment": comment},
                     cluster=event.node.cluster, request=request, now=now)
    return closed


@transaction.atomic
def do_silence_signature(node, *, signature, hours, reason, actor, request=None, now=None):
    """Events of `signature` on `node` stop counting against it for `hours`."""
    now = now or timezone.now()
    silence = Silence.objects.create(
        node=node, signature=signature, reason=reason, until=now + timedelta(hours=hours),
        created_at=now, created_by=actor)
    record_audit(actor, "silence.create", silence, cluster=node.cluster, request=request,
                 changes={"signature": signature, "hours": hours, "reason": reason}, now=now)
    refresh_node_state(node, actor=actor, reason=f"{signature} silenced for {hours:g} h", now=now)
    return silence


QUIET_XID_CLOSES_AFTER = timedelta(hours=1)


def close_quiet_events(now=None):
    """Xids NVIDIA's catalog does not count against the node close after an hour without a
    repeat (DESIGN.md's closing rules). Returns how many closed."""
    now = now or timezone.now()
    closed = 0
    quiet = HealthEvent.objects.open().filter(
        signature__startswith="xid:", severity=Severity.INFO,
        last_seen__lte=now - QUIET_XID_CLOSES_AFTER)
    for event in quiet.select_related("node"):
        closed += do_close_health_event(event, reason="no repeat for an hour", now=now)
    return closed


def refresh_ended_silences(since, now=None):
    """Nodes whose silence ended between `since` and now get their state recomputed."""
    now = now or timezone.now()
    ended = Silence.objects.filter(until__gt=since, until__lte=now).select_related("node")
    for silence in ended:
        refresh_node_state(silence.node, reason=f"silence on {silence.signature} ended", now=now)
    return len(ended)
