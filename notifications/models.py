"""Notifications (issue 16, DESIGN.md "Out of the browser").

A Channel is where messages go (an Apprise service URL, or a signed JSON webhook); its
Rules say which kinds of Alert it hears of. An Alert is one thing that needs a person: it
opens when its condition starts and resolves when it ends (notifications.alerts keeps them
from the change feed). Alerts are grouped per channel as Alertmanager groups them
(notifications.grouping): each group's state is a NotificationGroup, and each message sent
or to send is a Delivery, the channel's delivery log.
"""

import uuid

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from clusters.models import Cluster
from healthchecks.choices import Severity

from .choices import AlertKind


class Channel(models.Model):
    class Kind(models.TextChoices):
        APPRISE = "apprise", "Apprise URL (Slack, Teams, PagerDuty, Opsgenie, email, ...)"
        WEBHOOK = "webhook", "signed JSON webhook (Standard Webhooks)"

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE,
                                related_name="notification_channels")
    name = models.CharField(max_length=80)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    url_secret = models.CharField(
        max_length=64, help_text="the secrets store's name for the URL (never shown back)")
    signing_secret = models.CharField(
        max_length=64, blank=True, help_text="a webhook's signing key, in the secrets store")
    previous_signing_secret = models.CharField(
        max_length=64, blank=True, help_text="the key before the last rotation: messages are "
                                             "signed with both until previous_signing_until")
    previous_signing_until = models.DateTimeField(null=True, blank=True)
    url_hint = models.CharField(max_length=200, help_text="what the page shows of the URL")
    enabled = models.BooleanField(default=True)
    group_wait_s = models.PositiveIntegerField(
        default=30, validators=[MaxValueValidator(3600)],
        help_text="A new group's first message waits this long for more alerts to join it.")
    group_interval_s = models.PositiveIntegerField(
        default=120, validators=[MinValueValidator(10), MaxValueValidator(86400)],
        help_text="A group already notified waits this long before a message about what "
                  "changed in it (new alerts, resolved ones).")
    repeat_interval_s = models.PositiveIntegerField(
        default=4 * 3600, validators=[MinValueValidator(60), MaxValueValidator(7 * 86400)],
        help_text="A group still firing, unchanged, is sent again after this long.")
    max_per_hour = models.PositiveIntegerField(
        default=30, validators=[MinValueValidator(1), MaxValueValidator(3600)],
        help_text="At most this many messages an hour; past it, messages wait (alerts keep "
                  "grouping meanwhile, so nothing is lost).")
    send_resolved = models.BooleanField(default=True,
                                        help_text="Say when a group's alerts have resolved.")
    created_at = models.DateTimeField()
    created_by_name = models.CharField(max_length=150)

    class Meta:
        ordering = ["cluster", "name"]
        constraints = [models.UniqueConstraint(fields=["cluster", "name"],
                                               name="notification_channel_name_unique")]

    def __str__(self):
        return f"{self.name} ({self.get_kind_display()})"


class Rule(models.Model):
    """One kind of alert a channel hears of; for unhealthy nodes, from which severity and
    which signatures."""

    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="rules")
    kind = models.CharField(max_length=32, choices=AlertKind.choices)
    min_severity = models.CharField(max_length=8, choices=Severity.choices,
                                    default=Severity.WARNING)
    signature_prefix = models.CharField(
        max_length=64, blank=True, help_text="only signatures starting so (e.g. xid:), or all")

    class Meta:
        ordering = ["channel", "kind"]
        constraints = [models.UniqueConstraint(fields=["channel", "kind"],
                                               name="notification_rule_kind_unique")]

    def __str__(self):
        return f"{self.channel}: {self.get_kind_display()}"


class AlertQuerySet(models.QuerySet):
    def firing(self):
        return self.filter(resolved_at__isnull=True)


class Alert(models.Model):
    """One thing that needs a person, from when it starts until it ends. `key` names it
    within its cluster and kind ("repair:12", "event:345", "cluster"): one open alert a key.
    A one-off kind (a repair that failed) happens once: it is resolved as it opens, and each
    channel sends it once (NotificationGroup.one_offs_sent_through)."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="alerts")
    kind = models.CharField(max_length=32, choices=AlertKind.choices)
    key = models.CharField(max_length=64)
    node_id = models.BigIntegerField(null=True, blank=True)
    node_name = models.CharField(max_length=64, blank=True)
    signature = models.CharField(max_length=64, blank=True)
    severity = models.CharField(max_length=8, choices=Severity.choices, blank=True)
    summary = models.CharField(max_length=300)
    path = models.CharField(max_length=300, help_text="the console page that acts on it")
    opened_at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)

    objects = AlertQuerySet.as_manager()

    class Meta:
        ordering = ["opened_at", "id"]
        indexes = [models.Index(fields=["cluster", "resolved_at"])]
        constraints = [models.UniqueConstraint(
            fields=["cluster", "kind", "key"], condition=models.Q(resolved_at__isnull=True),
            name="one_firing_alert_per_key")]

    def __str__(self):
        return f"{self.get_kind_display()}: {self.summary}"


class NotificationGroup(models.Model):
    """Where one group of one channel stands (Alertmanager's aggregation group): which
    alerts its last message said were firing, and when it was sent."""

    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="groups")
    key = models.CharField(max_length=100, help_text="the kind, and for nodes the signature")
    notified_alert_ids = models.JSONField(default=list, blank=True)
    last_planned_at = models.DateTimeField(null=True, blank=True)
    one_offs_sent_through = models.BigIntegerField(
        default=0, help_text="the newest one-off alert (by id) this group has sent")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["channel", "key"],
                                               name="notification_group_unique")]

    def __str__(self):
        return f"{self.channel} / {self.key}"


class Delivery(models.Model):
    """One message to one channel, and how sending it went: the channel's delivery log.
    Its webhook id stays the same through retries, so a receiver can drop a repeat."""

    class Status(models.TextChoices):
        PENDING = "pending", "pending"
        SENDING = "sending", "sending"
        SENT = "sent", "sent"
        FAILED = "failed", "failed"

    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="deliveries")
    group_key = models.CharField(max_length=100, blank=True)
    message_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    event_type = models.CharField(max_length=32, help_text="alert.firing, alert.resolved, test")
    title = models.CharField(max_length=300)
    body = models.TextField(help_text="the message as people read it (Markdown)")
    payload = models.JSONField(help_text="the webhook's JSON body")
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.PENDING)
    created_at = models.DateTimeField()
    next_attempt_at = models.DateTimeField()
    lease_until = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    response_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.CharField(max_length=1000, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["status", "next_attempt_at"]),
                   models.Index(fields=["channel", "created_at"])]

    def __str__(self):
        return f"delivery {self.message_id} to {self.channel}: {self.status}"


class HeldAlert(models.Model):
    """An alert a channel did not send because its node (or the whole cluster) was in a
    maintenance window: once the window no longer covers it, the channel sends one summary
    of what is still open (notifications.grouping)."""

    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="held")
    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="+")
    window = models.ForeignKey("nodes.MaintenanceWindow", on_delete=models.CASCADE,
                               related_name="+")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["channel", "alert"],
                                               name="one_hold_per_channel_and_alert")]
