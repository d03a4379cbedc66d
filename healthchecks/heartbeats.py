"""Heartbeats, judged in one place (a beat task), from Node.last_seen.

The publisher writes last_seen once a second for every node heard from. A node that said
hello and has been silent for CLUSTERUI_HEARTBEAT_INTERVALS sample intervals gets an open
`heartbeat_lost` event (unhealthy, or still paused); when it is heard from again, the event
closes. Silence is measured up to the publisher's last tick (a console that stopped
listening says nothing about its nodes). After the publisher (re)starts, a node not heard
from since gets time to reconnect (agents' backoff is capped at 30 s); one heard from since
is judged at once: a handover of the publisher between server processes leaves the nodes
it kept hearing watched.
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


def sweep_heartbeats(now=None):
    now = now or timezone.now()
    status = PublisherStatus.objects.first()
    if status is None:
        return 0, 0
    cutoff = min(now, status.seen_at) - silence_limit()
    lost_open = HealthEvent.objects.open().filter(signature=SIGNATURE)
    silent = (
        Node.objects.filter(last_hello_at__isnull=False, last_seen__lt=cutoff)
        .exclude(pk__in=lost_open.values("node_id"))
    )
    grace = timedelta(seconds=settings.CLUSTERUI_HEARTBEAT_GRACE_S)
    if now - status.started_at < grace + silence_limit():
        # Agents are still reconnecting: only nodes heard from since the start are judged.
        silent = silent.filter(last_seen__gte=status.started_at)
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
