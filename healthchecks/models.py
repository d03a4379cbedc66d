import uuid

from django.conf import settings
from django.db import models

from nodes.models import AgentWork, Gpu, Node

from .choices import Severity, Source


class HealthEventQuerySet(models.QuerySet):
    def open(self):
        return self.filter(closed_at__isnull=True)


class HealthEvent(models.Model):
    """A health signal on a node (or one of its GPUs). Open until its closing rule holds."""

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="health_events")
    # RESTRICT: a GPU's row goes only with its node, and its events with the node too. Never
    # SET_NULL: two open per-GPU events of one signature would collide on
    # one_open_event_per_node_signature, and a GPU's history (by serial) would lose them.
    gpu = models.ForeignKey(
        Gpu, null=True, blank=True, on_delete=models.RESTRICT, related_name="health_events"
    )
    signature = models.CharField(max_length=64)
    severity = models.CharField(max_length=8, choices=Severity.choices)
    source = models.CharField(max_length=8, choices=Source.choices, default=Source.PASSIVE)
    message = models.CharField(max_length=1000, blank=True)
    evidence = models.JSONField(default=dict, blank=True)
    first_seen = models.DateTimeField()
    last_seen = models.DateTimeField()
    count = models.PositiveBigIntegerField(default=1)
    closed_at = models.DateTimeField(null=True, blank=True)
    closed_reason = models.CharField(max_length=255, blank=True)
    closed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    acknowledged_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    in_maintenance = models.BooleanField(
        default=False, help_text="opened while its node was in a maintenance window")

    objects = HealthEventQuerySet.as_manager()

    class Meta:
        ordering = ["-last_seen", "-id"]
        indexes = [
            models.Index(fields=["node", "closed_at"]),
            models.Index(fields=["signature"]),
        ]
        # One open event per (node, GPU, signature); node-level signals have no GPU.
        constraints = [
            models.UniqueConstraint(
                fields=["node", "gpu", "signature"],
                condition=models.Q(closed_at__isnull=True, gpu__isnull=False),
                name="one_open_event_per_gpu_signature",
            ),
            models.UniqueConstraint(
                fields=["node", "signature"],
                condition=models.Q(closed_at__isnull=True, gpu__isnull=True),
                name="one_open_event_per_node_signature",
            ),
        ]

    def __str__(self):
        return f"{self.node.name} {self.signature}"

    @property
    def is_open(self):
        return self.closed_at is None


class SilenceQuerySet(models.QuerySet):
    def active(self, now):
        return self.filter(until__gt=now)


class Silence(models.Model):
    """An operator's "known, don't count it" for one signature on one node, for a time.

    Events of that signature are still recorded, but do not make the node unhealthy.
    """

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="silences")
    signature = models.CharField(max_length=64)
    reason = models.CharField(max_length=255)
    until = models.DateTimeField()
    created_at = models.DateTimeField()
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )

    objects = SilenceQuerySet.as_manager()

    class Meta:
        ordering = ["-until"]
        indexes = [models.Index(fields=["node", "signature", "until"])]

    def __str__(self):
        return f"{self.signature} on {self.node.name} until {self.until:%Y-%m-%d %H:%M}"


class CheckRunQuerySet(models.QuerySet):
    def unfinished(self):
        return self.filter(status__in=CheckRun.UNFINISHED)


class CheckRun(AgentWork):
    """One active check asked of one node's agent (PROTOCOL.md `run_check`), and its result."""

    class Status(models.TextChoices):
        QUEUED = "queued", "queued"  # not yet handed to a connection of the node's agent
        RUNNING = "running", "running"  # sent to the agent; no result yet
        PASSED = "passed", "passed"
        FAILED = "failed", "failed"  # ran, below its baseline: the node has a problem
        ERROR = "error", "error"  # could not run (no torch on the node, a crash...)
        TIMED_OUT = "timed_out", "timed out"  # no result before its deadline

    class Purpose(models.TextChoices):
        ON_DEMAND = "on_demand", "on demand"
        ACCEPTANCE = "acceptance", "acceptance test"
        AFTER_REBOOT = "after_reboot", "after reboot"
        AFTER_RESET = "after_reset", "after a GPU reset"

    UNFINISHED = (Status.QUEUED, Status.RUNNING)

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="check_runs")
    check_name = models.CharField("check", max_length=32)
    params = models.JSONField(default=dict, blank=True)
    purpose = models.CharField(max_length=16, choices=Purpose.choices)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    boot_id = models.CharField(max_length=64, blank=True, help_text="the node's boot when asked")
    metrics = models.JSONField(default=dict, blank=True)
    health_event = models.ForeignKey(
        HealthEvent, null=True, blank=True, on_delete=models.SET_NULL, related_name="check_runs"
    )

    objects = CheckRunQuerySet.as_manager()

    class Meta(AgentWork.Meta):
        indexes = [
            models.Index(fields=["node", "purpose", "requested_at"]),
            models.Index(fields=["status", "deadline_at"]),
        ]

    def __str__(self):
        return f"{self.check_name} on {self.node.name} ({self.status})"

    @property
    def duration_s(self):
        if self.sent_at is None or self.finished_at is None:
            return None
        return (self.finished_at - self.sent_at).total_seconds()
