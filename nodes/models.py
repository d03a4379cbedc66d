import uuid

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.urls import reverse

from clusters.models import Cluster

from .choices import STATE_COLOURS, NodeRole, NodeState

# PROTOCOL.md's hello.node. \Z, not $: "$" would take a trailing newline.
node_name_validator = RegexValidator(
    r"\A[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z",
    "1-63 letters, digits, '-', '_' or '.', starting with a letter or digit",
)


class Node(models.Model):
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=63, validators=[node_name_validator])
    hostname = models.CharField(max_length=255, blank=True)

    # Derived: written only by nodes.states.refresh_node_state, from the facts below.
    # Empty only inside the transaction that registers the node.
    state = models.CharField(max_length=16, choices=NodeState.choices, blank=True, default="")
    state_reason = models.CharField(max_length=255, blank=True)
    state_changed_at = models.DateTimeField(null=True, blank=True)

    # Facts the state is computed from (DESIGN.md "Node states").
    joined_at = models.DateTimeField(help_text="registered, or last reprovisioned")
    last_hello_at = models.DateTimeField(null=True, blank=True)
    booted_at = models.DateTimeField(
        null=True, blank=True, help_text="when a hello with a new boot_id arrived"
    )
    boot_tasks_running = models.BooleanField(
        default=False, help_text="boot startup scripts or post-repair checks still running"
    )
    acceptance_required = models.BooleanField(
        default=False,
        help_text="acceptance tests were on for its cluster when it joined or was reprovisioned",
    )
    acceptance_passed_at = models.DateTimeField(null=True, blank=True)
    paused = models.BooleanField(default=False)
    paused_reason = models.CharField(max_length=255, blank=True)

    # Facts that higher apps own, handed down with refresh_node_state(node, **facts) in the
    # transaction that changed them (DESIGN.md "Layout": nodes imports none of them).
    open_problem = models.CharField(
        max_length=255, blank=True,
        help_text="its open warning/critical health events, worst first (healthchecks)")
    acceptance_detail = models.CharField(
        max_length=255, blank=True,
        help_text="where its acceptance battery stands, while pending (healthchecks)")
    checks_running_for_boot = models.CharField(
        max_length=64, blank=True,
        help_text="the boot id whose checks after a reboot are still running (healthchecks)")
    running_repair = models.CharField(
        max_length=255, blank=True, help_text="the repair running on it (repairs)")

    boot_scripts_due_by = models.DateTimeField(
        null=True, blank=True,
        help_text="boot startup scripts hold the node booting until their results, or this",
    )
    role = models.CharField(
        max_length=16, choices=NodeRole.choices, default=NodeRole.WORKER,
        help_text="picks its startup scripts (set by an admin on the node page: "
        "nodes.services.do_set_node_role)")

    # Open to re-join (PROTOCOL.md): until then a join-token hello with this node's name
    # re-registers it (a reprovisioned machine). An admin opens it from the node page; a
    # reprovision or failover repair opens it while it runs. rejoin_opened_by says who.
    rejoin_open_until = models.DateTimeField(null=True, blank=True)
    rejoin_opened_by = models.CharField(max_length=150, blank=True)
    boot_id = models.CharField(max_length=64, blank=True)
    agent_version = models.CharField(max_length=32, blank=True)
    slurm_state = models.CharField(
        max_length=64, blank=True, help_text="Slurm's state of the node at its latest hello "
        "(e.g. IDLE, MIXED, DRAIN); empty where it runs no Slurm")
    last_seen = models.DateTimeField(null=True, blank=True)
    hello_gpus = models.JSONField(
        null=True, blank=True,
        help_text="the GPUs of the latest hello, as the agent listed them (null: none recorded)",
    )
    hello_digest = models.CharField(
        max_length=64, blank=True,
        help_text="nodes.inventory.hello_digest of the latest hello: a re-hello with the same "
        "digest and boot id takes the gateway's two-statement path")

    class Meta:
        ordering = ["cluster", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="node_name_unique_in_cluster")
        ]
        indexes = [models.Index(fields=["cluster", "state"])]

    def __str__(self):
        return self.name

    def get_absolute_url(self):
        return reverse("nodes:detail", args=[self.cluster.slug, self.name])

    @property
    def state_colour(self):
        return STATE_COLOURS[self.state]


class GpuQuerySet(models.QuerySet):
    def in_inventory(self):
        return self.filter(removed_at__isnull=True)


class Gpu(models.Model):
    """A GPU of a node's inventory, or one that left it (kept for its events' history)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField("UUID", max_length=80)
    name = models.CharField("model", max_length=96, blank=True)
    serial = models.CharField(
        max_length=64, blank=True, db_index=True,
        help_text="the board's serial number (NVML): a GPU's history follows it across "
                  "nodes and clusters; empty where none was read (then the UUID does)")
    pci_bus_id = models.CharField("PCI bus id", max_length=32, blank=True)
    memory_total_bytes = models.BigIntegerField(null=True, blank=True)
    missing_since = models.DateTimeField(
        null=True, blank=True,
        help_text="first absent from a hello then; cleared when the inventory is accepted",
    )
    removed_at = models.DateTimeField(
        null=True, blank=True, help_text="left the inventory (an accepted replacement or loss)"
    )

    objects = GpuQuerySet.as_manager()

    class Meta:
        ordering = ["node", "index"]
        constraints = [
            # A GPU that left the inventory gives its index to the one that replaced it.
            models.UniqueConstraint(fields=["node", "index"], name="gpu_index_unique_in_node",
                                    condition=models.Q(removed_at__isnull=True)),
            models.UniqueConstraint(fields=["node", "uuid"], name="gpu_uuid_unique_in_node"),
        ]

    def __str__(self):
        return f"{self.node.name} GPU {self.index}"


class NodeTransition(models.Model):
    """One change of a node's state: the cluster's event timeline."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="transitions")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="transitions")
    from_state = models.CharField(max_length=16, choices=NodeState.choices, blank=True)
    to_state = models.CharField(max_length=16, choices=NodeState.choices)
    reason = models.CharField(max_length=255, blank=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_name = models.CharField(max_length=150, help_text="the user, or 'system'")
    at = models.DateTimeField()

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [
            models.Index(fields=["cluster", "-at"]),
            models.Index(fields=["node", "-at"]),
        ]

    def __str__(self):
        return f"{self.node.name}: {self.from_state or '-'} -> {self.to_state}"


class ClusterRollup(models.Model):
    """One minute of cluster-wide usage across all GPU nodes: the overview's chart."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="rollups")
    minute = models.DateTimeField()
    gpus_reporting = models.PositiveIntegerField()
    gpu_util_pct = models.FloatField(help_text="mean GPU utilization, percent")
    gpu_mem_used_pct = models.FloatField(help_text="GPU memory used over total, percent")
    net_bps = models.FloatField(help_text="node network rx + tx, bytes per second")
    gpu_sm_active_pct = models.FloatField(
        null=True, help_text="mean SM activity of the GPUs that report it (NVML's GPM, "
                             "Hopper and later), percent; null where none does")

    class Meta:
        ordering = ["minute"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "minute"], name="one_rollup_per_minute")
        ]


class AgentTokenQuerySet(models.QuerySet):
    def usable(self, now):
        return self.filter(revoked_at__isnull=True).filter(
            models.Q(expires_at__isnull=True) | models.Q(expires_at__gt=now)
        )


class AgentToken(models.Model):
    """A credential an agent presents (PROTOCOL.md "Connecting"). Only its hash is stored.

    A join token is bound to a cluster and registers nodes; a node token is bound to one node.
    """

    class Kind(models.TextChoices):
        JOIN = "join", "join"
        NODE = "node", "node"

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    kind = models.CharField(max_length=4, choices=Kind.choices)
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="agent_tokens")
    node = models.ForeignKey(
        Node, null=True, blank=True, on_delete=models.CASCADE, related_name="agent_tokens"
    )
    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12, help_text="the token's first characters, to tell it")
    note = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    single_use = models.BooleanField(
        default=False, help_text="a join token that stops working once a node joined with it")
    for_node = models.ForeignKey(
        Node, null=True, blank=True, on_delete=models.CASCADE, related_name="+",
        help_text="a join token that may only re-join this node (made by its repair)")

    objects = AgentTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(kind="join", node__isnull=True)
                | models.Q(kind="node", node__isnull=False),
                name="node_token_names_its_node",
            ),
            models.CheckConstraint(condition=models.Q(kind="join") | models.Q(for_node__isnull=True),
                                   name="only_a_join_token_is_for_a_node"),
        ]

    def __str__(self):
        return f"{self.kind} token {self.prefix}…"

    def status(self, now):
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"


class AgentEventReceipt(models.Model):
    """Each agent event id, stored once: a resent event is acked again, not stored twice."""

    event_id = models.UUIDField(primary_key=True)
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+")
    received_at = models.DateTimeField()
    health_event = models.ForeignKey(
        "healthchecks.HealthEvent", null=True, on_delete=models.SET_NULL, related_name="+"
    )


class NodeRollup(models.Model):
    """One minute of one node: [mean, max] of each GPU metric per GPU, and of its network.

    gpus: {uuid: {"util_pct": [mean, max], "sm_active_pct": [...], "mem_used_bytes": [...],
    "temp_c": [...], "power_w": [...]}} (a metric the GPU does not report: [null, null]); node: {"net_rx_bps": [mean, max], "net_tx_bps": [...], "cpu_pct": [...]}.
    """

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="rollups")
    minute = models.DateTimeField()
    gpus = models.JSONField(default=dict)
    node_metrics = models.JSONField(default=dict)

    class Meta:
        ordering = ["minute"]
        constraints = [
            models.UniqueConstraint(fields=["node", "minute"], name="one_node_rollup_per_minute")
        ]
        indexes = [models.Index(fields=["minute"])]


class AgentWork(models.Model):
    """What check runs and commands share: work asked of one node's agent (nodes.agent_work).

    The primary key is the protocol's id (`run_id`, a command's `id`); pages and URLs use
    `public_id`. Each kind gives `node` its related name and `status` its choices."""

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+")
    status = models.CharField(max_length=16)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+", help_text="empty: the system (a repair, a hello)",
    )
    requested_at = models.DateTimeField()
    sent_at = models.DateTimeField(null=True, blank=True)
    deadline_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    message = models.TextField(blank=True)

    UNFINISHED = ()

    class Meta:
        abstract = True
        ordering = ["-requested_at", "-id"]

    @property
    def is_finished(self):
        return self.status not in self.UNFINISHED


class AgentCommandQuerySet(models.QuerySet):
    def unfinished(self):
        return self.filter(status__in=AgentCommand.UNFINISHED)


class AgentCommand(AgentWork):
    """One action asked of a node's agent (PROTOCOL.md `command`), and how it ended.

    A reboot is done when the node says hello with another boot id than `boot_id_before`
    (nodes.services.finish_reboots_after_hello): a rebooting agent cannot say `ok`.
    """

    class Action(models.TextChoices):
        REBOOT = "reboot", "reboot"
        CLEANUP = "cleanup", "clean up processes"  # orphans of ended jobs, zombies' parents
        RECONFIGURE = "reconfigure", "reconfigure Slurm's GPUs"  # the reconfigure repair
        RESET_GPU = "reset_gpu", "reset one GPU"  # params {"gpu_uuid"}: the reset_gpu repair
        # params {"bundle_id", "upload_url", "max_bytes", "deadline_s"}: nodes.bundles
        COLLECT_BUNDLE = "collect_bundle", "collect a diagnostic bundle"

    class Status(models.TextChoices):
        QUEUED = "queued", "queued"  # not yet handed to a connection of the node's agent
        SENT = "sent", "sent"  # handed to a connection; no answer yet
        ACCEPTED = "accepted", "accepted"  # the agent started it (a reboot: under way)
        OK = "ok", "ok"
        FAILED = "failed", "failed"
        TIMED_OUT = "timed_out", "timed out"  # not finished before its deadline

    UNANSWERED = (Status.QUEUED, Status.SENT)  # these go out (again) after a hello
    UNFINISHED = (*UNANSWERED, Status.ACCEPTED)
    # How long an action may take, from the request to its end. A reboot includes the
    # node's boot: GPU servers take 5-10 minutes through their firmware.
    DEFAULT_DEADLINE_S = {Action.REBOOT: 15 * 60, Action.CLEANUP: 2 * 60,
                          Action.RECONFIGURE: 5 * 60, Action.RESET_GPU: 5 * 60,
                          Action.COLLECT_BUNDLE: 3 * 60}

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="agent_commands")
    action = models.CharField(max_length=16, choices=Action.choices)
    params = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    boot_id_before = models.CharField(
        max_length=64, blank=True, help_text="the node's boot id when the command was asked"
    )

    objects = AgentCommandQuerySet.as_manager()

    class Meta(AgentWork.Meta):
        indexes = [
            models.Index(fields=["node", "status"]),
            models.Index(fields=["status", "deadline_at"]),
        ]

    def __str__(self):
        return f"{self.action} on {self.node.name} ({self.status})"


class DiagnosticBundle(models.Model):
    """The evidence a node's agent collected before a repair touched the node, or when an
    operator asked (PROTOCOL.md "Diagnostic bundles"): one gzip-compressed tar file in the
    bundle storage (settings STORAGES["bundles"]), asked for by a collect_bundle command and
    uploaded to /agent/bundles/<public_id>/. nodes.bundles holds what is done with it (the
    storage is looked up at each use, never kept: a setting changes it)."""

    class Status(models.TextChoices):
        REQUESTED = "requested", "requested"
        STORED = "stored", "stored"
        FAILED = "failed", "not sent"  # the agent could not, or did not in time
        EXPIRED = "expired", "deleted after its retention"

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="bundles")
    command = models.ForeignKey(AgentCommand, null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="+")
    reason = models.CharField(max_length=200, help_text="before repair #12, asked by alice")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                     on_delete=models.SET_NULL, related_name="+")
    requested_at = models.DateTimeField()
    max_bytes = models.PositiveBigIntegerField()
    deadline_s = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.REQUESTED)
    message = models.CharField(max_length=500, blank=True, help_text="why it was not sent")
    stored_as = models.CharField(max_length=300, blank=True,
                                 help_text="its name in the bundle storage")
    size_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    sha256 = models.CharField(max_length=64, blank=True)
    stored_at = models.DateTimeField(null=True, blank=True)
    listing = models.JSONField(default=list, blank=True,
                               help_text="[{name, size}] of the files inside, as listed")
    unpacked_bytes = models.PositiveBigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["-requested_at", "-id"]
        indexes = [models.Index(fields=["status", "stored_at"])]

    def __str__(self):
        return f"bundle {self.public_id} of {self.node.name} ({self.status})"

    @property
    def filename(self):
        return f"{self.node.name}-{self.requested_at:%Y%m%dT%H%M%S}-{str(self.public_id)[:8]}.tar.gz"


class PublisherStatus(models.Model):
    """When the live publisher (the one that writes last_seen) started and last ran.

    Heartbeats are judged only while it runs, and not before agents had time to reconnect
    after it started: a console that was down says nothing about its nodes.
    """

    started_at = models.DateTimeField()
    seen_at = models.DateTimeField()

    class Meta:
        verbose_name_plural = "publisher status"



class MaintenanceWindow(models.Model):
    """A time when a set of nodes (or the whole cluster) is in maintenance: no
    repair is recommended or started for them, their events are marked, and notifications
    about them wait for one summary at the window's end (nodes.maintenance). Once, from
    starts_at to ends_at (open-ended without one: how an admin pauses a cluster), or
    recurring: an occurrence of duration_minutes at each time of `cron` (UTC) from starts_at
    on, until ends_at if set."""

    cluster = models.ForeignKey("clusterui.Cluster", on_delete=models.CASCADE,
                                related_name="maintenance_windows")
    whole_cluster = models.BooleanField(
        default=False, help_text="every node of the cluster (else only `nodes`: a window whose "
                                 "nodes were all removed covers none)")
    nodes = models.ManyToManyField(Node, blank=True, related_name="maintenance_windows")
    reason = models.CharField(max_length=300)
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField(null=True, blank=True)
    cron = models.CharField(max_length=100, blank=True,
                            help_text="recurring: when each occurrence starts (UTC), e.g. "
                                      "'0 2 * * 6' for Saturdays at 02:00")
    duration_minutes = models.PositiveIntegerField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True, help_text="ended by hand")
    ended_by_name = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField()
    created_by_name = models.CharField(max_length=150)

    class Meta:
        ordering = ["-starts_at", "-id"]

    def __str__(self):
        return f"maintenance window #{self.pk}: {self.reason}"
