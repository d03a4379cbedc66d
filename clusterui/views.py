import logging

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_not_required
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.http import JsonResponse
from django.db.models import Count, Q
from datetime import timedelta

from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from nodes.choices import NodeState
from nodes.models import AgentToken
from nodes.services import do_issue_join_token, do_revoke_agent_token

from . import overview as read
from .forms import ClusterCreateForm, ClusterSettingsForm, JoinTokenForm, TimelineFilterForm
from .models import Cluster
from .roles import Role, has_role, require_role
from .services import do_create_cluster, do_update_cluster


def get_cluster_for_user(request, slug):
    """The cluster named by `slug`, for a user who may read it (every role reads every cluster)."""
    return get_object_or_404(Cluster, slug=slug)


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
        "nodes_in_acceptance": read.nodes_in_acceptance(cluster),
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
    hours = form.cleaned_data["expires_in_hours"]
    _, plaintext = do_issue_join_token(
        cluster, actor=request.user, note=form.cleaned_data["note"], request=request,
        expires_at=timezone.now() + timedelta(hours=hours) if hours else None,
    )
    return render(request, "clusterui/cluster_settings.html",
                  _settings_context(request, cluster, new_join_token=plaintext))


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
