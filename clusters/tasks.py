from celery import shared_task

from . import change_feed


@shared_task(name="clusterui.tasks.prune_changes")
def prune_changes():
    """Beat, hourly: drop change feed rows older than the retention."""
    return change_feed.prune_changes()
