import re

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, URLValidator
from django.db import models
from django.urls import reverse
from django.utils import timezone

# The placeholders of Cluster.ssh_command_template (nodes/queries.py ssh_command fills them)
# and of Cluster.grafana_url_template (nodes/queries.py grafana_url).
SSH_PLACEHOLDER = re.compile(r"\{(user|node|hostname|login)\}")
GRAFANA_PLACEHOLDER = re.compile(r"\{(node|cluster)\}")


def refuse_unknown_placeholders(value, known, names):
    """ValidationError naming the first {placeholder} of `value` that `known` does not match."""
    unknown = re.findall(r"\{[^{}]*\}", known.sub("", value))
    if unknown:
        raise ValidationError(f"Unknown placeholder {unknown[0]}: use {names}.")


def validate_ssh_command_template(value):
    refuse_unknown_placeholders(value, SSH_PLACEHOLDER,
                                "{user}, {node}, {hostname} or {login}")


def validate_grafana_url_template(value):
    refuse_unknown_placeholders(value, GRAFANA_PLACEHOLDER, "{node} and {cluster}")
    URLValidator(schemes=["http", "https"])(GRAFANA_PLACEHOLDER.sub("x", value))


class Cluster(models.Model):
    name = models.CharField(max_length=100, unique=True)
    slug = models.SlugField(max_length=50, unique=True)
    region = models.CharField(max_length=64, blank=True)
    gpu_type = models.CharField("GPU type", max_length=64, blank=True)
    gpus_per_node = models.PositiveSmallIntegerField("GPUs per node", default=8)
    driver_version = models.CharField(max_length=32, blank=True)
    networking = models.CharField(max_length=128, blank=True)
    os_image = models.CharField("OS image", max_length=128, blank=True)
    billing_rate_per_gpu_hour = models.DecimalField(
        "billing rate (USD per GPU-hour)",
        max_digits=8,
        decimal_places=4,
        default=0,
        validators=[MinValueValidator(0)],
    )
    acceptance_tests_enabled = models.BooleanField(
        "run acceptance tests on new and reprovisioned nodes", default=False
    )
    acceptance_checks = models.CharField(
        "acceptance battery", max_length=255, blank=True,
        help_text="The checks a new node passes before it takes work, space-separated "
                  "(healthchecks' catalog). Empty: the default battery.")
    degraded_threshold_pct = models.PositiveSmallIntegerField(
        "degraded over (% of nodes out of service)", default=10,
        validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="The cluster counts as degraded while more than this share of its nodes "
                  "are out of service (paused or unhealthy): the overview says so, and "
                  "notification rules can ask for it.")
    # PROTOCOL.md: a join-token hello naming an existing node is refused unless that node
    # is open to re-join; an admin may open the whole cluster for a while (a migration).
    rejoin_open_until = models.DateTimeField(
        null=True, blank=True,
        help_text="until then, join tokens may re-register any existing node of the cluster")
    rejoin_opened_by = models.CharField(max_length=150, blank=True)
    class Scheduler(models.TextChoices):
        NONE = "none", "none (nothing to drain)"
        SLURM = "slurm", "Slurm"
        KUBERNETES = "kubernetes", "Kubernetes"

    scheduler = models.CharField(
        max_length=16, choices=Scheduler.choices, default=Scheduler.NONE,
        help_text="What runs the cluster's jobs: repairs drain and resume nodes through it, "
                  "and job accounting reads Slurm's.")
    scheduler_config = models.CharField(
        max_length=255, blank=True,
        help_text="Slurm: the slurm.conf the console's scontrol and sacct use (empty: the "
                  "default). Kubernetes: a kubeconfig path (empty: in-cluster credentials).")
    ssh_login_host = models.CharField(
        "SSH login host", max_length=255, blank=True,
        help_text="The login (jump) host: {login} in the SSH command template.")
    ssh_command_template = models.CharField(
        "SSH command template", max_length=255, default="ssh {user}@{node}", blank=True,
        validators=[validate_ssh_command_template],
        help_text="The node page's SSH command: {user} (the signed-in user), {node}, "
                  "{hostname} and {login}, e.g. ssh -J {login} {user}@{node}. Empty: none shown.")
    class Status(models.TextChoices):
        # DESIGN.md "Cluster status", in precedence order: clusters.status decides it.
        PAUSED = "paused", "paused"
        PROVISIONING = "provisioning", "provisioning"
        ACCEPTING = "accepting", "accepting"
        DEGRADED = "degraded", "degraded"
        READY = "ready", "ready"

    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PROVISIONING,
                              editable=False)
    status_reason = models.CharField(max_length=255, blank=True, editable=False)
    status_changed_at = models.DateTimeField(null=True, blank=True, editable=False)
    grafana_url_template = models.CharField(
        "Grafana URL", max_length=500, blank=True, validators=[validate_grafana_url_template],
        help_text="A node's dashboard: {node} and {cluster} are filled in, e.g. https://grafana"
                  ".example.com/d/dcgm?var-instance={node}. Empty: CLUSTERUI_GRAFANA_NODE_URL.")
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    # Fields shown as "the configuration" and recorded in the audit trail on change.
    CONFIGURATION_FIELDS = (
        "name",
        "region",
        "gpu_type",
        "gpus_per_node",
        "driver_version",
        "networking",
        "os_image",
        "billing_rate_per_gpu_hour",
        "acceptance_tests_enabled",
        "acceptance_checks",
        "degraded_threshold_pct",
        "scheduler",
        "scheduler_config",
        "ssh_login_host",
        "ssh_command_template",
        "grafana_url_template",
    )

    class Meta:
        ordering = ["name"]
        permissions = [
            ("operate_cluster", "Can act on nodes, health checks and repairs"),
            ("administer_cluster", "Can change cluster settings"),
        ]

    def __str__(self):
        return self.name

    def get_absolute_url(self):
        return reverse("clusterui:overview", args=[self.slug])

    def is_degraded(self, out_of_service, total):
        """Whether `out_of_service` of `total` nodes is over the degraded threshold."""
        return total > 0 and out_of_service * 100 > total * self.degraded_threshold_pct


class ClusterTransition(models.Model):
    """One change of a cluster's status: a row on the cluster's timeline (clusters.status)."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE,
                                related_name="status_transitions")
    from_status = models.CharField(max_length=16, choices=Cluster.Status.choices, blank=True)
    to_status = models.CharField(max_length=16, choices=Cluster.Status.choices)
    reason = models.CharField(max_length=255, blank=True)
    actor_name = models.CharField(max_length=150, help_text="the user, or 'system'")
    at = models.DateTimeField()

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["cluster", "-at"])]

    def __str__(self):
        return f"{self.cluster}: {self.from_status or '-'} -> {self.to_status}"


class AuditEntryQuerySet(models.QuerySet):
    """No bulk update or delete either: the trail is append-only. Deleting a user or a
    cluster still clears an entry's actor or cluster: Django's collector uses the plain base
    manager, not this one."""

    def update(self, **kwargs):
        raise ValueError("audit entries are append-only")

    update.alters_data = True

    def delete(self):
        raise ValueError("audit entries are append-only")

    delete.alters_data = True


class AuditEntry(models.Model):
    """Append-only record of a change: who, what, on which object, before and after."""

    at = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_name = models.CharField(max_length=150)
    action = models.CharField(max_length=64, db_index=True)
    object_type = models.CharField(max_length=64)
    object_id = models.CharField(max_length=64)
    object_repr = models.CharField(max_length=200)
    changes = models.JSONField(default=dict, blank=True)
    source_ip = models.GenericIPAddressField(null=True, blank=True)
    cluster = models.ForeignKey(
        Cluster, null=True, blank=True, on_delete=models.SET_NULL, related_name="audit_entries"
    )

    objects = AuditEntryQuerySet.as_manager()

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "audit entries"

    def __str__(self):
        return f"{self.at:%Y-%m-%d %H:%M} {self.actor_name} {self.action} {self.object_repr}"

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise ValueError("audit entries are append-only")
        super().save(*args, **kwargs)

    save.alters_data = True

    def delete(self, *args, **kwargs):
        raise ValueError("audit entries are append-only")

    delete.alters_data = True


class KubernetesAccess(models.Model):
    """How people reach a Kubernetes cluster's API server with their own IdP identity: where
    the API server is and which CA signs it (for their kubeconfig), and how the API server
    reads the IdP's ID tokens (its OIDC flags and the role bindings' group names). Admins
    edit it on the cluster's Kubernetes access page (clusters/kubeaccess.py)."""

    class UsernameClaim(models.TextChoices):
        SUB = "sub", "sub (the IdP's stable user id)"
        EMAIL = "email", "email"

    cluster = models.OneToOneField(Cluster, on_delete=models.CASCADE,
                                   related_name="kubernetes_access")
    api_server_url = models.URLField(
        "API server URL", max_length=255, blank=True,
        validators=[URLValidator(schemes=["https"], message="An https:// URL.", code="not_https")],
        help_text="The address people's kubectl uses, e.g. https://k8s.example.com:6443.")
    certificate_authority_data = models.TextField(
        "CA bundle", blank=True,
        help_text="The CA that signs the API server's certificate: PEM, or base64 of the PEM "
                  "(a kubeconfig's certificate-authority-data). Empty: the system's CAs.")
    oidc_issuer_url = models.URLField(
        "OIDC issuer", max_length=255, blank=True,
        help_text="The IdP whose ID tokens the API server takes, e.g. https://idp.example.com/"
                  "realms/gpu (its discovery document is checked). Empty: the console's own.")
    oidc_groups_claim = models.CharField(
        "groups claim", max_length=64, blank=True,
        help_text="The ID token's claim that lists a person's groups. Empty: the console's.")
    oidc_client_id = models.CharField(
        "kubectl's OIDC client id", max_length=255, blank=True,
        help_text="A public client (no secret, PKCE) registered at the IdP for kubectl, with "
                  "http://localhost:8000 as a redirect URI. Empty: the console's client id.")
    oidc_scopes = models.CharField(
        "extra scopes", max_length=255, blank=True, default="groups",
        help_text="Scopes kubectl asks for besides openid, space-separated: whatever makes the "
                  "IdP put the groups claim in the ID token (Okta, Keycloak: groups; Entra ID: "
                  "none, the app's token configuration adds it).")
    username_claim = models.CharField(max_length=32, choices=UsernameClaim.choices,
                                      default=UsernameClaim.SUB.value)
    username_prefix = models.CharField(
        max_length=64, blank=True, default="oidc:",
        help_text="Put before every Kubernetes user name from the IdP (empty: none).")
    groups_prefix = models.CharField(
        max_length=64, blank=True, default="oidc:",
        help_text="Put before every Kubernetes group name from the IdP (empty: none).")
    operator_namespaces = models.CharField(
        max_length=1000, blank=True,
        help_text="Namespaces operators may edit, space- or comma-separated. Empty: every "
                  "namespace (a ClusterRoleBinding to edit), else a RoleBinding in each.")
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        verbose_name_plural = "Kubernetes access"

    def __str__(self):
        return f"Kubernetes access to {self.cluster}"

    @property
    def operator_namespace_list(self):
        return self.operator_namespaces.replace(",", " ").split()

    @property
    def oidc_scope_list(self):
        return self.oidc_scopes.replace(",", " ").split()


class Identity(models.Model):
    """Who a user is at the OpenID Connect provider: the ID token's iss and sub. Users are
    found by these, never by email or name, which people can change at the IdP."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oidc_identity")
    issuer = models.CharField(max_length=255)
    sub = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)
    last_sign_in_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "identities"
        constraints = [
            models.UniqueConstraint(fields=["issuer", "sub"], name="identity_issuer_sub_unique")
        ]

    def __str__(self):
        return f"{self.sub} at {self.issuer}"


class FailedSignIn(models.Model):
    """A password sign-in that was refused (local form or break-glass). Counted per account
    name and per source address by clusters/sign_in_limits.py; rows older than the
    lockout window are deleted as new ones come."""

    at = models.DateTimeField(db_index=True)
    username = models.CharField(max_length=150, db_index=True)  # casefolded
    source_ip = models.GenericIPAddressField(null=True, blank=True, db_index=True)

    def __str__(self):
        return f"{self.username} from {self.source_ip or 'unknown'} at {self.at:%Y-%m-%d %H:%M:%S}"


class Change(models.Model):
    """One row of the change feed (DESIGN.md "Data flow"): something a person or another
    part of the system must react to changed, in the transaction that wrote this row.

    Services append rows (clusters.change_feed.record_change); readers (the publisher, the
    recommender) never import the writers, and read through clusters.change_feed.read_changes.
    node_id and object_id are plain values: the feed sits below the apps it speaks of.
    """

    class Kind(models.TextChoices):
        NODE_STATE = "node_state", "a node's state"
        HEALTH_EVENT = "health_event", "a health event opened, closed or acknowledged"
        HEALTH_REPEAT = "health_repeat", "a repeat counted on an open health event"
        REPAIR = "repair", "a repair"
        CHECK_RUN = "check_run", "a check run"
        SCRIPT_RUN = "script_run", "a startup script run"
        AGENT_WORK = "agent_work", "work queued for a node's agent"
        AGENT_CONFIG = "agent_config", "a node's agent configuration"
        AGENT_ACCESS = "agent_access", "a node's token revoked, or the node removed"

    id = models.BigAutoField(primary_key=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="+")
    node_id = models.BigIntegerField(null=True, blank=True)
    object_id = models.CharField(max_length=64, blank=True,
                                 help_text="what changed: a pk, or for agent work 'kind:pk'")
    at = models.DateTimeField()

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["at"])]

    def __str__(self):
        return f"change {self.pk}: {self.kind} {self.object_id}"


class FeedCursor(models.Model):
    """Where one reader of the change feed stands: the highest id it has read, and the ids
    below it that were not committed yet when it read (PostgreSQL hands ids out before
    commit), to be read once they commit (or forgotten after a while: rolled back)."""

    reader = models.CharField(max_length=32, primary_key=True)
    version = models.PositiveBigIntegerField(
        default=0, help_text="one more at every read: two readers of one name, one wins")
    last_id = models.BigIntegerField(default=0)
    gaps = models.JSONField(default=dict, blank=True,
                            help_text="{id: unix time it was first missed}")
    read_at = models.DateTimeField(null=True, blank=True)

    def __str__(self):
        return f"{self.reader} at {self.last_id}"


SECRET_NAME = re.compile(r"[A-Z][A-Z0-9_]{0,63}")


def validate_secret_name(name):
    if not SECRET_NAME.fullmatch(name):
        raise ValidationError("1-64 capital letters, digits and '_', starting with a letter: "
                              "it is the name of an environment variable (IPMI_PASSWORD).")


class Secret(models.Model):
    """A named credential (clusters/secret_store.py): encrypted at rest with the key from the
    settings, never from the database; handed to provider commands and startup scripts that
    name it as $NAME, as an environment variable. Nobody reads it back."""

    name = models.CharField(max_length=64, unique=True, validators=[validate_secret_name])
    description = models.CharField(max_length=200, blank=True)
    ciphertext = models.TextField(help_text="Fernet token of the value")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    updated_by_name = models.CharField(max_length=150)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name
