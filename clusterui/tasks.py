from celery import shared_task

from . import changes


@shared_task
def prune_changes():
    """Beat, hourly: drop change feed rows older than the retention."""
    return changes.prune_changes()
