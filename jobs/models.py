from django.db import models

from clusters.models import Cluster


class Job(models.Model):
    """One job of a cluster as Slurm's accounting (sacct) last reported it."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="jobs")
    # Slurm's id as sacct prints it: "41", or "41_3" for an array task.
    job_id = models.CharField(max_length=64)
    name = models.CharField(max_length=255, blank=True)
    user = models.CharField(max_length=64, blank=True)
    account = models.CharField(max_length=64, blank=True)
    partition = models.CharField(max_length=64, blank=True)
    # Slurm's compressed list, e.g. "gpu-[001-002]"; JobNode holds the names one by one.
    node_list = models.TextField(blank=True)
    gpus = models.PositiveIntegerField(default=0)
    start = models.DateTimeField(null=True, blank=True)  # null while pending
    end = models.DateTimeField(null=True, blank=True)  # null while pending or running
    state = models.CharField(max_length=64, blank=True)
    exit_code = models.CharField(max_length=16, blank=True)
    elapsed_s = models.PositiveIntegerField(default=0)
    imported_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    # The fields an import compares and writes (everything sacct reports).
    SACCT_FIELDS = ("name", "user", "account", "partition", "node_list", "gpus", "start",
                    "end", "state", "exit_code", "elapsed_s")

    class Meta:
        ordering = ["-start", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "job_id"], name="job_unique_per_cluster"),
        ]
        indexes = [
            models.Index(fields=["cluster", "start"]),
            models.Index(fields=["cluster", "end"]),
        ]

    def __str__(self):
        return f"job {self.job_id} on {self.cluster}"


class JobNode(models.Model):
    """A node a job ran on, by name: Slurm's nodes need not be nodes the console knows."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="job_nodes")
    node_name = models.CharField(max_length=255)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "node_name"], name="job_node_unique"),
        ]
        indexes = [models.Index(fields=["node_name"])]


class ImportCursor(models.Model):
    """Where a cluster's job import got to. imported_until moves only after the rows up to
    it are stored, so an import that fails or is killed starts again from here."""

    cluster = models.OneToOneField(Cluster, on_delete=models.CASCADE, related_name="job_import")
    imported_until = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    last_warnings = models.JSONField(
        default=list, blank=True, help_text="the first sacct lines the last import could not read")
    last_warning_count = models.PositiveIntegerField(default=0)

    def __str__(self):
        return f"job import of {self.cluster}"
