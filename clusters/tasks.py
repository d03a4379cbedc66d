from celery import shared_task

from . import change_feed, services


@shared_task(name="clusterui.tasks.prune_changes")
def prune_changes():
    """Beat, hourly: drop change feed rows older than the retention."""
    return change_feed.prune_changes()


@shared_task(name="clusterui.tasks.prune_audit")
def prune_audit():
    """Beat, hourly: audit entries past CLUSTERUI_AUDIT_RETENTION_DAYS go, where an admin set
    one; the audit trail is kept for good otherwise."""
    return services.prune_audit()
