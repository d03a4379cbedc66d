"""Startup scripts: per cluster, one script for each (event, role), every save a new
version; and the runs the agents report (script_result frames). A node's role
(nodes.choices.NodeRole) picks its scripts."""

from django.conf import settings
from django.db import models

from clusters.models import Cluster
from nodes.choices import NodeRole


class ScriptEvent(models.TextChoices):
    NODE_BOOT = "node_boot", "node boot"
    JOB_START = "job_start", "job start"
    JOB_END = "job_end", "job end"


DEFAULT_TIMEOUT_S = 300
MAX_TIMEOUT_S = 3600


class StartupScript(models.Model):
    """The script a cluster runs on its nodes of one role at one lifecycle event. Its body is
    its current (highest-numbered) version's."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="startup_scripts")
    event = models.CharField(max_length=16, choices=ScriptEvent.choices)
    role = models.CharField(max_length=16, choices=NodeRole.choices)
    timeout_s = models.PositiveIntegerField(default=DEFAULT_TIMEOUT_S)
    current_version = models.ForeignKey(
        "StartupScriptVersion", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering = ["cluster", "event", "role"]
        constraints = [models.UniqueConstraint(fields=["cluster", "event", "role"],
                                               name="startup_script_unique_event_role")]

    def __str__(self):
        return f"{self.get_event_display()} script for {self.role} nodes"


class StartupScriptVersion(models.Model):
    script = models.ForeignKey(StartupScript, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    body = models.TextField()
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField()
    shellcheck_warnings = models.TextField(
        blank=True, help_text="what shellcheck said at save (or that it was not installed)")
    warnings_accepted = models.BooleanField(default=False)
    rolled_back_from = models.PositiveIntegerField(
        null=True, blank=True, help_text="the version whose body this one restored")

    class Meta:
        ordering = ["script", "-number"]
        constraints = [models.UniqueConstraint(fields=["script", "number"],
                                               name="startup_script_version_unique_number")]

    def __str__(self):
        return f"version {self.number}"


class ScriptRun(models.Model):
    """One script_result frame: a startup script ran on a node."""

    node = models.ForeignKey("nodes.Node", on_delete=models.CASCADE, related_name="script_runs")
    script = models.ForeignKey(StartupScript, null=True, on_delete=models.SET_NULL,
                               related_name="runs")
    version = models.ForeignKey(StartupScriptVersion, null=True, blank=True,
                                on_delete=models.SET_NULL, related_name="runs")
    version_number = models.BigIntegerField(null=True, blank=True)
    event = models.CharField(max_length=16, choices=ScriptEvent.choices)
    job_id = models.CharField(max_length=64, blank=True)
    exit_code = models.BigIntegerField(null=True, blank=True)
    timed_out = models.BooleanField(default=False)
    duration_s = models.FloatField()
    output_tail = models.TextField(blank=True)
    received_at = models.DateTimeField()

    class Meta:
        ordering = ["-received_at", "-id"]
        indexes = [models.Index(fields=["node", "-received_at"])]

    def __str__(self):
        return f"{self.event} run on node {self.node_id}"

    @property
    def succeeded(self):
        return self.exit_code == 0 and not self.timed_out
