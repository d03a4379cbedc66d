"""The pages that compose several apps: the cluster list, creating a cluster, the overview
(states, usage, the timeline) and the cluster's settings (its configuration, join tokens and
re-join)."""

from datetime import timedelta

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST


from clusters.queries import get_cluster_for_user
from clusters.roles import Role, has_role, require_role
from clusters.services import do_update_cluster
from nodes.cluster_status import refresh_cluster_statuses
from nodes.install_command import console_ca_pem, daemonset_manifest, install_panel
from nodes.wheelhouse import read_manifest
from nodes.forms import JoinTokenForm, RejoinForm
from nodes.models import AgentToken
from nodes.services import (
    do_close_cluster_rejoin,
    do_issue_join_token,
    do_open_cluster_rejoin,
    do_revoke_agent_token,
)

from . import queries as read
from .creation import (
    ClusterCreationForm,
    do_create_cluster_with_setup,
    form_initial,
    review_sections_of,
    sections_of,
)
from .forms import ClusterSettingsPageForm, TimelineFilterForm


@require_GET
@require_role(Role.VIEWER)
def cluster_list(request):
    return render(request, "overview/cluster_list.html",
                  {"clusters": read.clusters_with_state_counts()})


@require_http_methods(["GET", "POST"])
@require_role(Role.ADMIN)
def cluster_create(request):
    """The creation page (overview/creation.py): edit, then review (every check run), then
    create; "Change" on the review comes back to the page with the choices kept."""
    step = request.POST.get("step", "review")
    if request.method == "POST" and step == "edit":
        form = ClusterCreationForm(initial=form_initial(ClusterCreationForm, request.POST))
    else:
        form = ClusterCreationForm(request.POST or None)
    if request.method == "POST" and step in ("review", "create") and form.is_valid():
        if step == "create":
            cluster = do_create_cluster_with_setup(form, actor=request.user, request=request)
            messages.success(request, f"Cluster {cluster.name} created.")
            return redirect(cluster)
        return render(request, "overview/cluster_review.html",
                      {"form": form, "review": form.review,
                       "sections": review_sections_of(form)})
    return render(request, "overview/cluster_create.html",
                  {"form": form, "sections": sections_of(form)},
                  status=400 if form.is_bound and form.errors else 200)


@require_GET
@require_role(Role.VIEWER)
def overview(request, slug):
    cluster = get_cluster_for_user(request, slug)
    filters = TimelineFilterForm(request.GET)
    query = filters.cleaned_data if filters.is_valid() else {}
    timeline = read.timeline_page(
        cluster, node_name=query.get("node", ""), state=query.get("state", ""),
        routine=query.get("routine", False), page=query.get("page") or 1,
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
        "other_agents": read.nodes_on_another_agent(cluster),
        "repairs_awaiting": read.repairs_awaiting_approval(cluster),
        "needs_you": read.needs_you(cluster),
        "usage": read.usage(cluster),
        "timeline": timeline,
        "filters": filters,
    }
    # htmx refreshes one panel: "Needs you" or the timeline.
    part = "needs-you" if request.htmx.target == "needs-you" else "timeline"
    template = "overview/overview.html" + (f"#{part}" if request.htmx else "")
    return render(request, template, context)


@require_http_methods(["GET", "POST"])
@require_role(Role.VIEWER)
def cluster_settings(request, slug):
    cluster = get_cluster_for_user(request, slug)
    if request.method == "POST" and not has_role(request.user, Role.ADMIN):
        raise PermissionDenied("Changing settings needs the admin role.")
    form = ClusterSettingsPageForm(request.POST or None, instance=cluster)
    if request.method == "POST" and form.is_valid():
        _, changed = do_update_cluster(form, actor=request.user, request=request)
        # Acceptance and the degraded threshold decide the status.
        refresh_cluster_statuses([cluster.pk], actor=request.user)
        messages.success(
            request, f"Saved: {', '.join(changed)}." if changed else "Nothing changed."
        )
        return redirect("clusterui:cluster_settings", cluster.slug)
    return render(request, "overview/cluster_settings.html",
                  _settings_context(request, cluster, form=form))


def _settings_context(request, cluster, **extra):
    return {
        "cluster": cluster,
        "tab": "settings",
        "node_count": cluster.nodes.count(),
        "form": ClusterSettingsPageForm(instance=cluster),
        "token_form": JoinTokenForm(),
        "rejoin_form": RejoinForm(),
        "cluster_rejoin_open": (cluster.rejoin_open_until is not None
                                and cluster.rejoin_open_until > timezone.now()),
        "join_tokens": cluster.agent_tokens.filter(kind=AgentToken.Kind.JOIN),
        "agent_install": install_panel(request.build_absolute_uri("/")),
        "now": timezone.now(),
        **extra,
    }


@require_GET
@require_role(Role.VIEWER)
def agent_daemonset(request, slug):
    """The cluster's agent as a Kubernetes DaemonSet (nodes/install_command.py)."""
    cluster = get_cluster_for_user(request, slug)
    manifest = read_manifest()
    if manifest is None:
        raise Http404("no agent wheelhouse is built: run manage.py build_agent_wheelhouse")
    text = daemonset_manifest(manifest, request.build_absolute_uri("/"), cluster.slug,
                              console_ca_pem())
    return HttpResponse(text, content_type="application/yaml", headers={
        "Content-Disposition": f'attachment; filename="clusterui-agent-{cluster.slug}.yaml"'})


@require_POST
@require_role(Role.ADMIN)
def join_token_create(request, slug):
    cluster = get_cluster_for_user(request, slug)
    form = JoinTokenForm(request.POST)
    if not form.is_valid():
        return render(request, "overview/cluster_settings.html",
                      _settings_context(request, cluster, token_form=form), status=400)
    _, plaintext = do_issue_join_token(
        cluster, actor=request.user, note=form.cleaned_data["note"], request=request,
        expires_at=timezone.now() + timedelta(hours=form.cleaned_data["expires_in_hours"]),
        single_use=form.cleaned_data["single_use"],
    )
    return render(request, "overview/cluster_settings.html",
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
