import uuid
from datetime import datetime

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.urls import reverse

from clusters.models import Cluster
from healthchecks.models import HealthEvent
from nodes.models import Gpu, Node

from .choices import (
    OPEN_STATUSES,
    STATUS_COLOURS,
    Action,
    AtDeadline,
    DrainMode,
    Status,
    StepKind,
    StepStatus,
)


class RepairSettings(models.Model):
    """How repairs run on one cluster: what reprovisions its nodes, and how much of it may
    be out of service at once (what drains them is the cluster's scheduler). Admins edit it."""

    class Provider(models.TextChoices):
        SIMULATED = "simulated", "simulated (the demo fleet)"
        COMMAND = "command", "shell commands"

    cluster = models.OneToOneField(Cluster, on_delete=models.CASCADE, related_name="repair_settings")
    provider = models.CharField(max_length=16, choices=Provider.choices, default=Provider.COMMAND)
    provider_commands = models.JSONField(
        default=dict, blank=True,
        help_text="{action: shell command} for reprovision, failover and remove, with "
                  "{node}, {hostname}, {cluster}, {action} and {join_token} placeholders "
                  "({join_token}: a single-use join token for the node's new machine).")
    blast_radius_pct = models.PositiveSmallIntegerField(
        default=10, validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="A repair waits while it would put more than this share of the cluster's "
                  "nodes out of service (counting its own node; one node may always be).")
    boot_timeout_s = models.PositiveIntegerField(
        default=1800, help_text="How long a repair waits for the node to come back.")

    # Count windows (DESIGN.md "Repairs"): the same fault again and again raises the action.
    class WindowMode(models.TextChoices):
        ACT = "act", "act: raise the recommendation"
        RECORD_ONLY = "record_only", "record only: say what it would have recommended"
        OFF = "off", "off"

    window_mode = models.CharField(max_length=16, choices=WindowMode.choices,
                                   default=WindowMode.ACT)
    window_action = models.CharField(
        max_length=16, choices=[("reprovision", "reprovision"), ("failover", "failover"),
                                ("remove", "remove")], default="remove",
        help_text="What a tripped count window recommends (it only ever raises the action).")
    xid_window_count = models.PositiveSmallIntegerField(
        default=5, validators=[MinValueValidator(2)],
        help_text="Fatal Xids on one GPU (each event the agent sends; a coalesced burst is "
                  "one) that trip the GPU's window...")
    xid_window_hours = models.PositiveSmallIntegerField(
        default=24, validators=[MinValueValidator(1), MaxValueValidator(720)],
        help_text="...within this many hours.")
    repair_window_count = models.PositiveSmallIntegerField(
        default=5, validators=[MinValueValidator(2)],
        help_text="Repairs that took one node out of service that trip the node's window...")
    repair_window_days = models.PositiveSmallIntegerField(
        default=7, validators=[MinValueValidator(1), MaxValueValidator(90)],
        help_text="...within this many days.")

    def __str__(self):
        return f"repair settings of {self.cluster}"


class DrainFields(models.Model):
    """How a repair treats the jobs on its node (repairs.drain_modes): on a policy row, what
    its signature's repairs get (empty: the defaults); on a repair, what it does."""

    drain_mode = models.CharField(max_length=16, choices=DrainMode.choices, blank=True)
    drain_deadline_s = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(60)],
        help_text="after the jobs end, signal then wait: how long the drain waits")
    drain_at_deadline = models.CharField(max_length=16, choices=AtDeadline.choices, blank=True)
    drain_signal = models.CharField(max_length=16, blank=True,
                                    help_text="signal then wait: the signal (USR1)")
    drain_signal_all_steps = models.BooleanField(
        default=False, help_text="signal then wait: every step and the batch shell, not the "
                                 "batch shell only")

    class Meta:
        abstract = True


class RepairPolicy(DrainFields):
    """An admin's choice for one signature on one cluster: which action it calls for (the
    default ladder, another first rung, or none), whether its recommendations approve
    themselves, and how its repairs drain. Signatures without a row get the defaults
    (repairs.policy, repairs.drain_modes)."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="repair_policies")
    signature = models.CharField(max_length=64)
    action = models.CharField(max_length=16, choices=Action.choices, blank=True, null=True,
                              help_text="null: the default ladder; empty: no repair")
    auto_approve = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering = ["cluster", "signature"]
        constraints = [models.UniqueConstraint(fields=["cluster", "signature"],
                                               name="one_policy_per_signature")]

    def __str__(self):
        return f"{self.signature} -> {self.action or 'none'}"


class RepairQuerySet(models.QuerySet):
    def open(self):
        return self.filter(status__in=OPEN_STATUSES)


class Repair(DrainFields):
    """A recommended or requested repair of one node, and its execution. `status` moves only
    through repairs.transitions.transition(). Its drain fields are its DrainPlan
    (repairs.drain_modes.plan_of), set when it is proposed and changeable at approval."""

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="repairs")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="repairs")
    gpu = models.ForeignKey(Gpu, null=True, blank=True, on_delete=models.RESTRICT,
                            related_name="repairs")  # as HealthEvent.gpu: goes with the node
    action = models.CharField(max_length=16, choices=Action.choices)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PROPOSED)
    signature = models.CharField(max_length=64, help_text="the failure it answers")
    reason = models.TextField(help_text="why this action: the policy, escalation, a person")
    events = models.ManyToManyField(HealthEvent, blank=True, related_name="repairs")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+", help_text="empty: recommended by the system")
    requested_at = models.DateTimeField()
    reviewed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    reviewed_at = models.DateTimeField(null=True, blank=True)
    review_comment = models.CharField(max_length=500, blank=True)
    auto_approved = models.BooleanField(default=False)
    waiting_reason = models.CharField(max_length=255, blank=True)
    boot_id_before = models.CharField(max_length=64, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.TextField(blank=True, help_text="how it ended: success, or the failure")
    superseded_by = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL,
                                      related_name="+")
    follows = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="the repair this one comes after: a lighter rung that did not fix it, or a "
                  "rejected or cancelled one that something new broke through")
    follows_why = models.CharField(max_length=500, blank=True,
                                   help_text="what is new since `follows`, in words")
    would_have = models.CharField(
        max_length=500, blank=True,
        help_text="a count window in record-only mode: what it would have recommended")
    approval_view = models.JSONField(
        default=dict, blank=True,
        help_text="what the card showed the person who approved it: the jobs at risk (or why "
                  "the scheduler could not be read), the nodes they span, the blast radius")
    bundle = models.ForeignKey(
        "nodes.DiagnosticBundle", null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+", help_text="the diagnostic bundle taken right before the act")
    snooze_until = models.DateTimeField(
        null=True, blank=True,
        help_text="rejected or cancelled: no new recommendation for its events until then "
                  "(empty: until they close), unless something new or costlier comes")

    objects = RepairQuerySet.as_manager()

    class Meta:
        ordering = ["-requested_at", "-id"]
        indexes = [models.Index(fields=["cluster", "status"]),
                   models.Index(fields=["node", "status"])]
        constraints = [
            # One open repair per node: the database refuses a second.
            models.UniqueConstraint(
                fields=["node"], name="one_open_repair_per_node",
                condition=models.Q(status__in=["proposed", "approved", "waiting", "running"])),
        ]

    def __str__(self):
        return f"#{self.pk} {self.action} {self.node.name} ({self.status})"

    def get_absolute_url(self):
        return reverse("repairs:detail", args=[self.cluster.slug, self.public_id])

    @property
    def status_colour(self):
        return STATUS_COLOURS[self.status]

    @property
    def number(self):
        return self.pk


class RepairTransition(models.Model):
    """One move of a repair's status: who, when, why. Append-only."""

    repair = models.ForeignKey(Repair, on_delete=models.CASCADE, related_name="transitions")
    from_status = models.CharField(max_length=16, choices=Status.choices, blank=True)
    to_status = models.CharField(max_length=16, choices=Status.choices)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                              on_delete=models.SET_NULL, related_name="+")
    actor_name = models.CharField(max_length=150)
    reason = models.CharField(max_length=500, blank=True)
    at = models.DateTimeField()

    class Meta:
        ordering = ["at", "id"]

    def __str__(self):
        return f"#{self.repair_id} {self.from_status} -> {self.to_status}"


class RepairStep(models.Model):
    """One step of a running repair. Each runs as its own short Celery task and may run
    again (a worker killed mid-step); `details` records what it has already done, so a
    second run does not do it twice."""

    repair = models.ForeignKey(Repair, on_delete=models.CASCADE, related_name="steps")
    position = models.PositiveSmallIntegerField()
    kind = models.CharField(max_length=16, choices=StepKind.choices)
    status = models.CharField(max_length=16, choices=StepStatus.choices,
                              default=StepStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    next_check_at = models.DateTimeField(null=True, blank=True)
    lease_holder = models.CharField(
        max_length=64, blank=True, help_text="the delivery (Celery task id) running it now")
    lease_until = models.DateTimeField(
        null=True, blank=True,
        help_text="a running step whose worker died is run again after this (repairs.steps)")
    message = models.CharField(max_length=500, blank=True, help_text="where it stands, in words")
    output = models.TextField(blank=True, help_text="what the commands said")
    details = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["repair", "position"]
        constraints = [models.UniqueConstraint(fields=["repair", "position"],
                                               name="one_step_per_position")]
        indexes = [models.Index(fields=["status", "next_check_at"])]

    def __str__(self):
        return f"#{self.repair_id} step {self.position} {self.kind} ({self.status})"

    @property
    def waiting_for_jobs(self):
        """A drain that waits for jobs: the jobs ({id, user, name, nodes, time_left_s}), as
        its last check found them; [] otherwise."""
        if self.kind != StepKind.DRAIN or self.status not in (StepStatus.WAITING,
                                                              StepStatus.RUNNING):
            return []
        return self.details.get("jobs") or []

    @property
    def drain_deadline(self):
        """When a waiting drain stops waiting (or asks an operator), or None."""
        deadline = self.details.get("deadline")
        return datetime.fromisoformat(deadline) if deadline else None
