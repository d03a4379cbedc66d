"""What the notification pages read."""

from django.db.models import OuterRef, Subquery

from .models import Channel, Delivery

LOG_ROWS = 50


def channel_rows(cluster):
    """The cluster's channels with their rules and their newest delivery."""
    newest = Delivery.objects.filter(channel=OuterRef("pk")).order_by("-created_at", "-id")
    return (Channel.objects.filter(cluster=cluster).prefetch_related("rules")
            .annotate(last_status=Subquery(newest.values("status")[:1]),
                      last_at=Subquery(newest.values("created_at")[:1])))


def delivery_log(channel):
    return list(Delivery.objects.filter(channel=channel)[:LOG_ROWS])
