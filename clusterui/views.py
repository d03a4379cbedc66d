import json
import logging

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_not_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import connection
from django.http import HttpResponse, JsonResponse
from django.db.models import Count, Q
from datetime import timedelta

from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from common.exports import csv_response, invalid_filters_response
from nodes.choices import NodeState
from nodes.models import AgentToken
from nodes.forms import RejoinForm
from nodes.services import (
    do_close_cluster_rejoin,
    do_issue_join_token,
    do_open_cluster_rejoin,
    do_revoke_agent_token,
)

from . import kubeaccess
from . import queries as read
from .queries import get_cluster_for_user
from .filters import AuditEntryFilter
from .forms import (
    ClusterCreateForm,
    ClusterSettingsForm,
    JoinTokenForm,
    SecretForm,
    TimelineFilterForm,
)
from .secrets import SecretsUnavailable, do_delete_secret, do_set_secret
from .models import AuditEntry, Cluster, Secret
from .roles import Role, has_role, require_role
from .services import do_create_cluster, do_update_cluster


@require_GET
@require_role(Role.VIEWER)
def home(request):
    clusters = list(Cluster.objects.only("slug")[:2])
    if len(clusters) == 1:
        return redirect("clusterui:overview", clusters[0].slug)
    return redirect("clusterui:cluster_list")


@require_GET
@require_role(Role.VIEWER)
def cluster_list(request):
    counts = {state: Count("nodes", filter=Q(nodes__state=state)) for state in NodeState.values}
    clusters = Cluster.objects.annotate(node_count=Count("nodes"), **counts)
    return render(request, "clusterui/cluster_list.html", {"clusters": clusters})


@require_http_methods(["GET", "POST"])
@require_role(Role.ADMIN)
def cluster_create(request):
    form = ClusterCreateForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        cluster = do_create_cluster(form, actor=request.user, request=request)
        messages.success(request, f"Cluster {cluster.name} created.")
        return redirect(cluster)
    return render(request, "clusterui/cluster_create.html", {"form": form})


@require_GET
@require_role(Role.VIEWER)
def overview(request, slug):
    cluster = get_cluster_for_user(request, slug)
    filters = TimelineFilterForm(request.GET)
    query = filters.cleaned_data if filters.is_valid() else {}
    timeline = read.timeline_page(
        cluster, node_name=query.get("node", ""), state=query.get("state", ""),
        page=query.get("page") or 1,
    )
    counts = read.state_counts(cluster)
    context = {
        "cluster": cluster,
        "tab": "overview",
        "counts": counts,
        "node_count": sum(c["count"] for c in counts),
        "degraded": read.degraded(cluster, counts),
        "maintenance": read.maintenance_now(cluster),
        "nodes_in_acceptance": read.nodes_in_acceptance(cluster),
        "repairs_awaiting": read.repairs_awaiting_approval(cluster),
        "usage": read.usage(cluster),
        "timeline": timeline,
        "filters": filters,
    }
    template = "clusterui/overview.html" + ("#timeline" if request.htmx else "")
    return render(request, template, context)


@require_http_methods(["GET", "POST"])
@require_role(Role.VIEWER)
def cluster_settings(request, slug):
    cluster = get_cluster_for_user(request, slug)
    if request.method == "POST" and not has_role(request.user, Role.ADMIN):
        raise PermissionDenied("Changing settings needs the admin role.")
    form = ClusterSettingsForm(request.POST or None, instance=cluster)
    if request.method == "POST" and form.is_valid():
        _, changed = do_update_cluster(form, actor=request.user, request=request)
        messages.success(
            request, f"Saved: {', '.join(changed)}." if changed else "Nothing changed."
        )
        return redirect("clusterui:cluster_settings", cluster.slug)
    return render(request, "clusterui/cluster_settings.html",
                  _settings_context(request, cluster, form=form))


def _settings_context(request, cluster, **extra):
    return {
        "cluster": cluster,
        "tab": "settings",
        "node_count": cluster.nodes.count(),
        "form": ClusterSettingsForm(instance=cluster),
        "token_form": JoinTokenForm(),
        "rejoin_form": RejoinForm(),
        "cluster_rejoin_open": (cluster.rejoin_open_until is not None
                                and cluster.rejoin_open_until > timezone.now()),
        "join_tokens": cluster.agent_tokens.filter(kind=AgentToken.Kind.JOIN),
        "now": timezone.now(),
        **extra,
    }


@require_POST
@require_role(Role.ADMIN)
def join_token_create(request, slug):
    cluster = get_cluster_for_user(request, slug)
    form = JoinTokenForm(request.POST)
    if not form.is_valid():
        return render(request, "clusterui/cluster_settings.html",
                      _settings_context(request, cluster, token_form=form), status=400)
    _, plaintext = do_issue_join_token(
        cluster, actor=request.user, note=form.cleaned_data["note"], request=request,
        expires_at=timezone.now() + timedelta(hours=form.cleaned_data["expires_in_hours"]),
        single_use=form.cleaned_data["single_use"],
    )
    return render(request, "clusterui/cluster_settings.html",
                  _settings_context(request, cluster, new_join_token=plaintext))


@require_POST
@require_role(Role.ADMIN)
def cluster_rejoin_open(request, slug):
    """For a while (a migration), join tokens may re-register any existing node."""
    cluster = get_cluster_for_user(request, slug)
    form = RejoinForm(request.POST)
    if form.is_valid():
        until = timezone.now() + timedelta(hours=form.cleaned_data["hours"])
        do_open_cluster_rejoin(cluster, actor=request.user, until=until, request=request)
        messages.success(request, f"Every node of {cluster.name} is open to re-join until "
                                  f"{until:%H:%M} UTC.")
    else:
        messages.error(request, f"Not opened. {' '.join(form.errors['hours'])}")
    return redirect(reverse("clusterui:cluster_settings", args=[cluster.slug]) + "#rejoin")


@require_POST
@require_role(Role.ADMIN)
def cluster_rejoin_close(request, slug):
    cluster = get_cluster_for_user(request, slug)
    if do_close_cluster_rejoin(cluster, actor=request.user, request=request):
        messages.success(request, f"{cluster.name} is closed to re-join.")
    else:
        messages.info(request, f"{cluster.name} was not open to re-join.")
    return redirect(reverse("clusterui:cluster_settings", args=[cluster.slug]) + "#rejoin")


@require_POST
@require_role(Role.ADMIN)
def join_token_revoke(request, slug, public_id):
    cluster = get_cluster_for_user(request, slug)
    token = get_object_or_404(AgentToken, cluster=cluster, kind=AgentToken.Kind.JOIN,
                              public_id=public_id)
    if do_revoke_agent_token(token, actor=request.user, request=request):
        messages.success(request, f"Join token {token.prefix}… revoked.")
    else:
        messages.info(request, f"Join token {token.prefix}… was already revoked.")
    return redirect("clusterui:cluster_settings", cluster.slug)


logger = logging.getLogger(__name__)


def database_answers():
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        return cursor.fetchone() == (1,)


def redis_answers():
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    try:
        return client.ping() is True
    finally:
        client.close()


def health_probes():
    """What /healthz asks: the database, and Redis where there is one (production)."""
    probes = {"database": database_answers}
    if settings.REDIS_URL:
        probes["redis"] = redis_answers
    return probes


@login_not_required
@require_GET
def healthz(request):
    """The load balancer's probe: 200 when every backing service answers, else 503 naming
    the ones that did not. Why they failed goes to the log only: it may name hosts or users."""
    failed = []
    for name, answers in health_probes().items():
        try:
            ok = answers()
        except Exception:
            logger.exception("healthz: %s does not answer", name)
            ok = False
        if not ok:
            failed.append(name)
    if failed:
        return JsonResponse({"status": "failing", "failed": failed}, status=503,
                            headers={"Cache-Control": "no-store"})
    return JsonResponse({"status": "ok"}, headers={"Cache-Control": "no-store"})


@require_http_methods(["GET", "POST"])
@require_role(Role.VIEWER)
def kubernetes_access(request, slug):
    """Every user's kubeconfig, the API server's OIDC flags and the role bindings for a
    Kubernetes cluster; admins edit the settings they come from."""
    cluster = get_cluster_for_user(request, slug)
    if request.method == "POST" and not has_role(request.user, Role.ADMIN):
        raise PermissionDenied("Changing Kubernetes access needs the admin role.")
    if not kubeaccess.is_kubernetes(cluster):
        return render(request, "clusterui/kubeaccess_not_kubernetes.html",
                      {"cluster": cluster, "tab": "settings"},
                      status=200 if request.method == "GET" else 400)
    access = kubeaccess.access_for(cluster)
    initial = {} if access.pk else kubeaccess.console_kubeconfig_cluster(cluster)
    form = kubeaccess.KubernetesAccessForm(request.POST or None, instance=access, initial=initial)
    if request.method == "POST" and form.is_valid():
        changed = kubeaccess.do_update_kubernetes_access(cluster, form, actor=request.user,
                                                         request=request)
        messages.success(request, f"Saved: {', '.join(changed)}." if changed
                         else "Nothing changed.")
        return redirect("clusterui:kubernetes_access", cluster.slug)
    context = kubeaccess.page_context(cluster, kubeaccess.access_for(cluster),
                                      kubeaccess.oidc_facts(), request.user)
    return render(request, "clusterui/kubeaccess.html",
                  {**context, "form": form, "prefilled": sorted(initial)},
                  status=400 if form.errors else 200)


@require_GET
@require_role(Role.VIEWER)
def kubeconfig_download(request, slug):
    """The signed-in user's kubeconfig for the cluster, as a file."""
    cluster = get_cluster_for_user(request, slug)
    if not kubeaccess.is_kubernetes(cluster):
        raise Http404("Not a Kubernetes cluster.")
    config = kubeaccess.kubeconfig(kubeaccess.access_for(cluster), kubeaccess.oidc_facts(),
                                   request.user)
    if config is None:
        raise Http404("No kubeconfig yet: the API server URL or the OIDC settings are missing.")
    response = HttpResponse(kubeaccess.to_yaml(config), content_type="application/yaml")
    response["Content-Disposition"] = f'attachment; filename="kubeconfig-{cluster.slug}.yaml"'
    return response


AUDIT_PAGE_SIZE = 50
AUDIT_CSV_COLUMNS = ["time", "person", "action", "object_type", "object_id", "object",
                     "cluster", "source_ip", "changes"]


def audit_filter_for(request):
    return AuditEntryFilter(request.GET, queryset=AuditEntry.objects.select_related("cluster"))


@require_http_methods(["GET", "POST"])
@require_role(Role.ADMIN)
def secrets_page(request):
    """The secrets store: names, what each is for, who set it when; never a value. A POST sets
    one (a new name) or replaces its value."""
    form = SecretForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            secret, created = do_set_secret(
                form.cleaned_data["name"], form.cleaned_data["value"], actor=request.user,
                description=form.cleaned_data["description"], request=request)
        except SecretsUnavailable as exc:
            messages.error(request, str(exc))
        else:
            messages.success(request, f"Secret {secret.name} {'saved' if created else 'replaced'}.")
            return redirect("clusterui:secrets")
    return render(request, "clusterui/secrets.html", {"form": form,
                                                      "secrets": Secret.objects.all()},
                  status=400 if request.method == "POST" else 200)


@require_POST
@require_role(Role.ADMIN)
def secret_delete(request, secret):
    secret = get_object_or_404(Secret, name=secret)
    do_delete_secret(secret, actor=request.user, request=request)
    messages.success(request, f"Secret {secret.name} deleted.")
    return redirect("clusterui:secrets")


@require_GET
@require_role(Role.ADMIN)
def audit_list(request):
    """The audit trail, newest first: who changed what, when and from where."""
    audit_filter = audit_filter_for(request)
    matching = audit_filter.qs if audit_filter.is_valid() else AuditEntry.objects.none()
    page = Paginator(matching, AUDIT_PAGE_SIZE).get_page(request.GET.get("page"))
    rows = [(entry, change_lines(entry.changes)) for entry in page]
    context = {"filter": audit_filter, "page": page, "rows": rows}
    return render(request, "clusterui/audit.html" + ("#audit-table" if request.htmx else ""),
                  context)


def change_lines(changes):
    """An entry's changes as short lines: "region: us-west-2 → eu-north-1" for a changed
    field, "reason: disk swap" for anything else."""
    def text(value):
        return value if isinstance(value, str) else json.dumps(value, sort_keys=True)

    lines = []
    for key, value in changes.items():
        if isinstance(value, dict) and value.keys() == {"before", "after"}:
            lines.append(f"{key}: {text(value['before'])} → {text(value['after'])}")
        else:
            lines.append(f"{key}: {text(value)}")
    return lines


def audit_csv_row(entry):
    return [entry.at.isoformat(), entry.actor_name, entry.action,
            entry.object_type, entry.object_id, entry.object_repr,
            entry.cluster.slug if entry.cluster else "", entry.source_ip or "",
            json.dumps(entry.changes, sort_keys=True) if entry.changes else ""]


@require_GET
@require_role(Role.ADMIN)
def audit_csv(request):
    """The audit trail with the page's filters, every page, as CSV (times in UTC)."""
    audit_filter = audit_filter_for(request)
    if not audit_filter.is_valid():
        return invalid_filters_response(audit_filter.errors)
    return csv_response("audit.csv", AUDIT_CSV_COLUMNS,
                        (audit_csv_row(entry) for entry in audit_filter.qs.iterator(chunk_size=500)))
