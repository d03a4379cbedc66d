"""Creating a cluster (issue 28): one page of sections, reviewed before "Create", and one
audited action that makes the cluster with everything chosen for it.

    the configuration     name, region, GPU type and count, networking, OS image, billing
    the scheduler         Slurm, Kubernetes or none; the connection is tested on review
    acceptance tests      on or off with the trade-off, the battery, a recommendation
    OIDC for Kubernetes   issuer (its discovery document fetched), client id, groups claim;
                          the review shows the API server's flags and the role bindings
    startup scripts       examples from the library (startup.library), validated as on save
    the rest              a first notification channel (Apprise), the SSH command, the
                          Grafana URL, the first maintenance window

Sections live in several apps; this module is where they meet (the overview layer), and
do_create_cluster_with_setup() writes them in one transaction with one `cluster.create`
audit entry that lists every choice (the scripts and the window keep their own entries).
"""

from datetime import timedelta
from urllib.parse import urlsplit

import apprise
from django import forms
from django.conf import settings
from django.db import transaction

from clusters import kubeaccess
from clusters.forms import ClusterCreateForm
from clusters.models import Cluster, KubernetesAccess
from clusters.services import configuration_of, record_audit
from healthchecks.check_catalog import CHECKS, acceptance_battery, baselines
from nodes.cluster_status import refresh_cluster_statuses
from notifications.forms import ChannelForm
from notifications.models import Channel
from notifications.services import do_create_channel, url_hint
from nodes.services import do_create_maintenance_window
from schedulers import ExecutorError, scheduler_for
from startup.library import EXAMPLES, scripts_from
from startup.models import DEFAULT_TIMEOUT_S
from startup.services import do_save_startup_script, validate_body

from .forms import BatteryChoice, BatteryField, SealedSecretField

ACCEPTANCE_TRADE_OFF = (
    "Off: a node takes work as soon as its agent says hello: the fastest to available, "
    "right for short bursts and single-node research. On: every new or reprovisioned node "
    "stays pending until it passes the battery below against its GPU model's baseline, some "
    "minutes per node: right for multi-GPU training and long-running production, where a "
    "bad node costs far more at epoch 47 than at provisioning.")

SECTIONS = (
    ("configuration", "The configuration", "",
     ("name", "slug", "region", "gpu_type", "gpus_per_node", "planned_nodes", "driver_version",
      "networking", "os_image", "billing_rate_per_gpu_hour", "degraded_threshold_pct")),
    ("scheduler", "The scheduler", "What drains and resumes the nodes for repairs, and whose "
     "job accounting the Jobs tab reads. The console connects to it when you review.",
     ("scheduler", "scheduler_config")),
    ("acceptance", "Acceptance tests", ACCEPTANCE_TRADE_OFF,
     ("long_running", "acceptance_tests_enabled", "acceptance_checks")),
    ("kubernetes-oidc", "OIDC for the Kubernetes API", "Kubernetes clusters only: how the API "
     "server takes people's ID tokens, so they use kubectl as themselves. The issuer's discovery "
     "document is fetched when you review; the review shows the API server's flags and the "
     "role bindings to apply.", ("oidc_issuer_url", "oidc_client_id", "oidc_groups_claim")),
    ("startup-scripts", "Startup scripts", "Examples to start from, run by the nodes of the "
     "role shown; change them on the Startup scripts page at any time, with no rebuild.",
     ("startup_scripts",)),
    ("the-rest", "The rest", "A first notification channel (more, and signed webhooks, on the "
     "cluster's Notifications page), the SSH command, Grafana and a first maintenance window.",
     ("channel_url", "ssh_login_host", "ssh_command_template", "grafana_url_template",
      "window_reason", "window_starts_at", "window_hours")),
)


def example_choices():
    return [(example.key, f"{example.title}: {example.what} ({example.event.label}, "
                          f"{example.role.label} nodes)") for example in EXAMPLES]


class ClusterCreationForm(BatteryChoice, ClusterCreateForm):
    planned_nodes = forms.IntegerField(
        min_value=1, max_value=100_000, initial=8, label="nodes planned",
        help_text="How many nodes it will have: with the GPUs per node, its GPU count.")
    long_running = forms.BooleanField(
        required=False, label="for long-running production or multi-GPU training")
    oidc_issuer_url = forms.URLField(required=False, assume_scheme="https", label="issuer",
                                     help_text="Empty: the console's own IdP.")
    oidc_client_id = forms.CharField(required=False, max_length=255, label="client id",
                                     help_text="kubectl's public client at the IdP. Empty: "
                                               "the console's client id.")
    oidc_groups_claim = forms.CharField(required=False, max_length=64, label="groups claim",
                                        help_text="Empty: the console's.")
    startup_scripts = forms.MultipleChoiceField(
        choices=example_choices, required=False, widget=forms.CheckboxSelectMultiple,
        label="examples")
    channel_url = SealedSecretField(
        required=False, max_length=2000, label="notification channel",
        help_text="An Apprise URL (slack://…, msteams://…, pagerduty://…, opsgenie://…, "
                  "mailtos://…): repairs awaiting approval, failed, stuck or past their "
                  "deadline, and the cluster degraded, go there. Kept in the secrets store. "
                  "Empty: none yet.")
    window_reason = forms.CharField(
        required=False, max_length=300, label="first maintenance window",
        help_text="Its reason, e.g. burn-in: no repairs start and notifications wait while "
                  "it is on. Empty: none.")
    window_starts_at = forms.DateTimeField(
        required=False, label="from (UTC)",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    window_hours = forms.IntegerField(required=False, min_value=1, max_value=24 * 30,
                                      label="for (hours)", help_text="Empty: until ended.")

    review = None  # what the review shows, made by clean()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["acceptance_tests_enabled"].help_text = (
            f"Recommended from {settings.CLUSTERUI_ACCEPTANCE_RECOMMENDED_FROM_GPUS} GPUs, or "
            "for long-running clusters: the review says which this one is.")

    def clean(self):
        cleaned = super().clean()
        if self.errors:
            return cleaned
        review = {"gpus": cleaned["gpus_per_node"] * cleaned["planned_nodes"]}
        self._check_scheduler(cleaned, review)
        self._check_oidc(cleaned, review)
        self._check_scripts(cleaned, review)
        if cleaned.get("channel_url") and not apprise.Apprise().add(cleaned["channel_url"]):
            self.add_error("channel_url", "Apprise does not understand this URL (see the "
                                          "Apprise documentation for the service's URL form).")
        if cleaned.get("window_reason") and not cleaned.get("window_starts_at"):
            self.add_error("window_starts_at", "When does the window start?")
        recommended = (review["gpus"] >= settings.CLUSTERUI_ACCEPTANCE_RECOMMENDED_FROM_GPUS
                       or cleaned.get("long_running"))
        review["acceptance_recommended"] = recommended
        battery = acceptance_battery(Cluster(acceptance_checks=cleaned["acceptance_checks"]))
        review["battery"] = [(CHECKS[name], [b for b in baselines() if b.check == name
                                             and b.gpu_model == cleaned.get("gpu_type")])
                             for name in battery]
        self.review = review
        return cleaned

    def _check_scheduler(self, cleaned, review):
        trial = Cluster(scheduler=cleaned["scheduler"],
                        scheduler_config=cleaned.get("scheduler_config", ""))
        try:
            review["scheduler_answer"] = scheduler_for(trial).ping()
        except ExecutorError as exc:
            self.add_error("scheduler_config", f"The console could not reach it: {exc}")

    def _check_oidc(self, cleaned, review):
        if cleaned["scheduler"] != Cluster.Scheduler.KUBERNETES:
            return
        access = KubernetesAccess(oidc_issuer_url=cleaned.get("oidc_issuer_url", ""),
                                  oidc_client_id=cleaned.get("oidc_client_id", ""),
                                  oidc_groups_claim=cleaned.get("oidc_groups_claim", ""))
        facts = kubeaccess.oidc_facts(access)
        if not facts.issuer_url:
            self.add_error("oidc_issuer_url", "Give the issuer: the console has no OIDC "
                                              "sign-in to borrow it from.")
            return
        problem = kubeaccess.check_issuer(facts.issuer_url)
        if problem:
            self.add_error("oidc_issuer_url", problem)
            return
        review["oidc"] = {
            "warning": kubeaccess.issuer_warning(facts.issuer_url),
            "flags": kubeaccess.apiserver_flags(access, facts),
            "bindings": kubeaccess.to_yaml_documents(kubeaccess.role_bindings(access, facts)),
            "missing": facts.missing,
        }

    def _check_scripts(self, cleaned, review):
        scripts = scripts_from(cleaned.get("startup_scripts") or [])
        for (event, role), body in scripts.items():
            validation = validate_body(body)
            problem = validation.syntax_error or validation.warnings
            if problem:
                self.add_error("startup_scripts",
                               f"The {event} script for {role} nodes does not validate: {problem}")
        review["scripts"] = scripts

    def clean_oidc_issuer_url(self):
        return self.cleaned_data["oidc_issuer_url"].rstrip("/")


def sections_of(form):
    """SECTIONS with the form's bound fields: (id, title, intro, [field])."""
    return [(key, title, intro, [form[name] for name in names])
            for key, title, intro, names in SECTIONS]


def review_sections_of(form):
    """SECTIONS as the review shows them: (id, title, [(label, [what was chosen, in words])])."""
    return [(key, title, [(form[name].label, shown(form.fields[name], form.cleaned_data.get(name)))
                          for name in names])
            for key, title, _, names in SECTIONS]


def shown(field, value):
    """A cleaned value in words: choices by their labels, a box as yes or no."""
    if isinstance(value, bool):
        return ["yes" if value else "no"]
    if isinstance(field.widget, forms.PasswordInput) and value:
        return [url_hint(Channel.Kind.APPRISE, value)]  # a secret: its scheme only
    if isinstance(field, BatteryField) and not value:
        value = list(field.when_empty)
    if value in (None, "", []):
        return ["–"]
    choices = dict(getattr(field, "choices", None) or ())
    if isinstance(field, forms.MultipleChoiceField):
        values = value.split() if isinstance(value, str) else value
        return [str(choices.get(item, item)) for item in values]
    return [str(choices.get(value, value))]


def form_initial(form_class, data):
    """A form's initial values from posted data (the review's hidden fields): multiple
    choices as lists, a check box's "False" as False."""
    initial = {}
    for name, field in form_class.base_fields.items():
        if isinstance(field, forms.MultipleChoiceField):
            initial[name] = data.getlist(name)
        elif isinstance(field, forms.BooleanField):
            initial[name] = field.to_python(data.get(name))
        elif name in data:
            initial[name] = data.get(name)
    return initial


@transaction.atomic
def do_create_cluster_with_setup(form, *, actor, request=None):
    """Everything the creation page chose, in one transaction: the cluster, its Kubernetes
    OIDC, its startup scripts and its first maintenance window; one `cluster.create` audit
    entry lists it all."""
    data = form.cleaned_data
    cluster = form.save(commit=False)
    cluster.created_by = actor
    cluster.save()
    cluster.refresh_from_db()
    choices = {"after": configuration_of(cluster), "planned_nodes": data["planned_nodes"],
               "long_running": data["long_running"]}
    if cluster.scheduler == Cluster.Scheduler.KUBERNETES:
        access = KubernetesAccess.objects.create(
            cluster=cluster, oidc_issuer_url=data["oidc_issuer_url"],
            oidc_client_id=data["oidc_client_id"], oidc_groups_claim=data["oidc_groups_claim"],
            updated_by=actor)
        choices["kubernetes_oidc"] = {name: getattr(access, name) for name in (
            "oidc_issuer_url", "oidc_client_id", "oidc_groups_claim")}
    record_audit(actor, "cluster.create", cluster, changes=choices, cluster=cluster,
                 request=request)
    for (event, role), body in form.review["scripts"].items():
        do_save_startup_script(cluster, event=event, role=role, body=body,
                               timeout_s=DEFAULT_TIMEOUT_S, validation=validate_body(body),
                               actor=actor, request=request)
    if data.get("channel_url"):
        do_create_channel(cluster, name=f"{urlsplit(data['channel_url']).scheme} alerts",
                          kind=Channel.Kind.APPRISE, url=data["channel_url"],
                          rules=ChannelForm.default_rules(), actor=actor, request=request)
    if data.get("window_reason"):
        starts_at = data["window_starts_at"]
        ends_at = starts_at + timedelta(hours=data["window_hours"]) if data["window_hours"] else None
        do_create_maintenance_window(cluster, reason=data["window_reason"], starts_at=starts_at,
                                     ends_at=ends_at, actor=actor, request=request)
    refresh_cluster_statuses([cluster.pk], actor=actor)
    return cluster
