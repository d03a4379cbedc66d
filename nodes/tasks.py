from celery import shared_task

from . import agent_work, bundles, rollups, services, states


@shared_task
def refresh_due_node_states():
    """Beat, every 10 s: node states that change with time alone (a boot window ending)."""
    return states.refresh_due_node_states()


@shared_task
def prune_rollups():
    """Beat, hourly: drop per-minute rollups older than the retention."""
    return rollups.prune_rollups()


@shared_task
def prune_event_receipts():
    """Beat, hourly: agent event ids older than their retention are forgotten."""
    return services.prune_event_receipts()


@shared_task
def expire_commands():
    """Beat, every 30 s: agent commands past their deadline time out (a reboot whose node
    came back with a new boot id is done)."""
    return agent_work.expire_work(services.COMMANDS)


@shared_task
def prune_bundles():
    """Beat, hourly: diagnostic bundles past their retention are deleted from the storage."""
    return bundles.prune_bundles()
