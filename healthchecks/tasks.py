from datetime import timedelta

from celery import shared_task
from django.utils import timezone

from nodes import agent_work

from . import heartbeats, services

SWEEP_EVERY_S = 60.0


@shared_task
def sweep_heartbeats():
    """Beat, every second: open heartbeat_lost for silent nodes, close it for those back."""
    return heartbeats.sweep_heartbeats()


@shared_task
def sweep_health_events():
    """Beat, every minute: close quiet info Xids; re-judge nodes whose silence just ended."""
    now = timezone.now()
    closed = services.close_quiet_events(now=now)
    refreshed = services.refresh_ended_silences(
        since=now - timedelta(seconds=SWEEP_EVERY_S * 2), now=now)
    return closed, refreshed


@shared_task
def expire_check_runs():
    """Beat, every 30 s: runs past their deadline without a result time out."""
    return agent_work.expire_work(services.CHECK_RUNS)


@shared_task
def prune_closed_events():
    """Beat, hourly: closed events past CLUSTERUI_CLOSED_EVENT_RETENTION_DAYS go, except a
    repair's evidence."""
    return services.prune_closed_events()
