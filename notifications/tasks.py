from celery import shared_task

from . import alerts, deliveries, grouping


@shared_task
def notify():
    """Beat, every 2 s: alerts from the change feed (and stuck repairs), then the messages
    their groups are due."""
    return {"alerts": alerts.update_alerts(), "planned": grouping.plan_deliveries()}


@shared_task
def deliver(delivery_id):
    """One attempt at one message (the notify queue)."""
    delivery = deliveries.deliver(delivery_id)
    return None if delivery is None else delivery.status


@shared_task
def retry_deliveries():
    """Beat, every 10 s: deliveries whose retry is due or whose sender died."""
    return deliveries.retry_due()


@shared_task
def prune_notifications():
    """Beat, hourly: old resolved alerts and old deliveries go."""
    return alerts.prune()
