"""Heartbeats, judged in one place (a beat task), from Node.last_seen.

The publisher writes last_seen once a second for every node heard from. A node that said
hello and has been silent for CLUSTERUI_HEARTBEAT_INTERVALS sample intervals gets an open
`heartbeat_lost` event (unhealthy, or still paused); when it is heard from again, the event
closes. Silence is measured up to the publisher's last tick (a console that stopped
listening says nothing about its nodes), and only once agents have had time to reconnect
after it started (their backoff is capped at 30 s).
"""

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from nodes.models import Node, PublisherStatus

from .models import HealthEvent
from .services import do_close_health_event, do_record_health_event

SIGNATURE = "heartbeat_lost"


def silence_limit():
    return timedelta(seconds=settings.CLUSTERUI_SAMPLE_INTERVAL_S
                     * settings.CLUSTERUI_HEARTBEAT_INTERVALS)


def listened_until(now):
    """Up to when silence means something: the publisher's last tick, once agents had time
    to reconnect after it started. None while that is not yet the case."""
    status = PublisherStatus.objects.first()
    grace = timedelta(seconds=settings.CLUSTERUI_HEARTBEAT_GRACE_S)
    if status is None or now - status.started_at < grace + silence_limit():
        return None
    return min(now, status.seen_at)


def sweep_heartbeats(now=None):
    now = now or timezone.now()
    until = listened_until(now)
    if until is None:
        return 0, 0
    cutoff = until - silence_limit()
    lost_open = HealthEvent.objects.open().filter(signature=SIGNATURE)
    silent = (
        Node.objects.filter(last_hello_at__isnull=False, last_seen__lt=cutoff)
        .exclude(pk__in=lost_open.values("node_id"))
    )
    opened = 0
    for node in silent:
        do_record_health_event(
            node, signature=SIGNATURE, severity="critical",
            message=f"no frame from the agent for {silence_limit().total_seconds():g} s",
            evidence={"last_seen": node.last_seen.isoformat()}, now=now,
        )
        opened += 1
    closed = 0
    for event in lost_open.filter(node__last_seen__gte=cutoff).select_related("node"):
        closed += do_close_health_event(event, reason="the agent is reporting again", now=now)
    return opened, closed
