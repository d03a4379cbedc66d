from celery import shared_task

from . import states


@shared_task
def refresh_due_node_states():
    """Beat, every 10 s: node states that change with time alone (a boot window ending)."""
    return states.refresh_due_node_states()
