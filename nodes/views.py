import time
from datetime import timedelta

from django.conf import settings
from django.contrib import messages
from django.http import FileResponse, Http404, JsonResponse
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from clusters.queries import get_cluster_for_user
from clusters.roles import Role, has_role, require_role

from .choices import NodeRole
from .forms import (
    BulkNodesForm,
    BulkPauseForm,
    BulkRoleForm,
    MaintenanceWindowChangeForm,
    MaintenanceWindowForm,
    NodeRoleForm,
    PauseNodeForm,
    RejoinForm,
    RemoveNodeForm,
)
from .bundles import do_download_bundle, do_request_bundle, settle
from .live_store import get_live_store, stale_after_s
from .models import AgentCommand, DiagnosticBundle, MaintenanceWindow
from .wheelhouse import agent_is_behind, console_agent_version
from .responses import bulk_response, bulk_summary, node_status_or_redirect
from .queries import (
    CHART_METRICS,
    chart_series,
    get_node_for_user,
    gpu_inventory_context,
    grafana_url,
    hygiene_context,
    maintenance_windows,
    node_list_context,
    ssh_command,
)
from .services import (
    do_bulk_pause_nodes,
    do_bulk_resume_nodes,
    do_bulk_set_node_role,
    do_close_rejoin,
    do_create_maintenance_window,
    do_end_maintenance_window,
    do_update_maintenance_window,
    do_open_rejoin,
    do_pause_node,
    do_remove_node,
    do_send_command,
    do_resume_node,
    do_set_node_role,
    rejoin_opening,
)


@require_GET
@require_role(Role.VIEWER)
def node_list(request, slug):
    cluster = get_cluster_for_user(request, slug)
    context = {"cluster": cluster, "tab": "nodes", **node_list_context(cluster, request.GET)}
    return render(request, "nodes/list.html" + ("#node-table" if request.htmx else ""), context)


@require_GET
@require_role(Role.VIEWER)
def node_detail(request, slug, name):
    node = get_node_for_user(request, slug, name)
    agent_release = console_agent_version()
    context = {
        "cluster": node.cluster,
        "tab": "nodes",
        "node": node,
        **gpu_inventory_context(node),
        "transitions": node.transitions.all()[:50],
        "pause_form": PauseNodeForm(),
        "rejoin_form": RejoinForm(),
        "rejoin_opening": rejoin_opening(node, timezone.now()),
        "node_roles": NodeRole.choices,
        "grafana_url": grafana_url(node),
        **hygiene_context(node),
        "ssh_command": ssh_command(node, request.user),
        "agent_release": agent_release,
        "agent_behind": agent_is_behind(node.agent_version, agent_release),
        "bundles": node_bundles(node),
        "bundle_retention_days": settings.CLUSTERUI_BUNDLE_RETENTION_DAYS,
        "chart_range": request.GET.get("range") if request.GET.get("range") in CHART_RANGES
        else "hour",
    }
    return render(request, "nodes/detail.html", context)


CHART_RANGES = {"hour": timedelta(hours=1), "day": timedelta(days=1)}


@require_GET
@require_role(Role.VIEWER)
def node_charts(request, slug, name):
    """The node page's charts: per GPU, the per-minute means of the last hour or day."""
    node = get_node_for_user(request, slug, name)
    span = request.GET.get("range") if request.GET.get("range") in CHART_RANGES else "hour"
    return JsonResponse(chart_series(node, timezone.now() - CHART_RANGES[span]))


@require_GET
@require_role(Role.VIEWER)
def node_live(request, slug, name):
    """The node's latest sample, per GPU (the charts poll it every few seconds); "at" is
    null when the node has no fresh sample."""
    node = get_node_for_user(request, slug, name)
    entry = get_live_store().read_node(node.cluster_id, node.pk)
    if entry is None or time.time() - entry["received_at"] > stale_after_s():
        return JsonResponse({"at": None, "gpus": {}})
    return JsonResponse({"at": entry["ts"], "gpus": {
        gpu["uuid"]: {metric: gpu.get(metric) for metric in CHART_METRICS}
        for gpu in entry["gpus"]}})


@require_GET
@require_role(Role.VIEWER)
def node_hygiene(request, slug, name):
    """The node page's hygiene panel (it polls this)."""
    node = get_node_for_user(request, slug, name)
    return render(request, "nodes/detail.html#node-hygiene",
                  {"cluster": node.cluster, "node": node, **hygiene_context(node)})


@require_POST
@require_role(Role.OPERATOR)
def node_cleanup(request, slug, name):
    """Ask the node's agent to end the orphans of ended jobs and signal zombies' parents."""
    node = get_node_for_user(request, slug, name)
    command = do_send_command(node, AgentCommand.Action.CLEANUP, actor=request.user,
                              request=request)
    if request.htmx:
        return render(request, "nodes/detail.html#node-hygiene",
                      {"cluster": node.cluster, "node": node, **hygiene_context(node)})
    messages.success(request, f"Clean-up #{command.pk} asked of {node.name}'s agent.")
    return redirect("nodes:detail", node.cluster.slug, node.name)


@require_POST
@require_role(Role.OPERATOR)
def node_pause(request, slug, name):
    node = get_node_for_user(request, slug, name)
    form = PauseNodeForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Say why the node is paused.")
    elif do_pause_node(node, actor=request.user, reason=form.cleaned_data["reason"],
                       request=request):
        messages.success(request, f"{node.name} paused.")
    else:
        messages.info(request, f"{node.name} was already paused.")
    return node_status_or_redirect(request, node)


@require_POST
@require_role(Role.OPERATOR)
def node_resume(request, slug, name):
    node = get_node_for_user(request, slug, name)
    if do_resume_node(node, actor=request.user, request=request):
        messages.success(request, f"{node.name} resumed.")
    else:
        messages.info(request, f"{node.name} was not paused.")
    return node_status_or_redirect(request, node)


@require_POST
@require_role(Role.ADMIN)
def node_rejoin_open(request, slug, name):
    """For a while, a join token may re-register this node (its machine is reinstalled)."""
    node = get_node_for_user(request, slug, name)
    form = RejoinForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"{node.name}: not opened. {' '.join(form.errors['hours'])}")
        return redirect(node)
    until = timezone.now() + timedelta(hours=form.cleaned_data["hours"])
    do_open_rejoin(node, by=request.user.get_username(), until=until, actor=request.user,
                   request=request)
    messages.success(request, f"{node.name} is open to re-join until {until:%H:%M} UTC: a join "
                              f"token may register it once.")
    return redirect(node)


@require_POST
@require_role(Role.ADMIN)
def node_rejoin_close(request, slug, name):
    node = get_node_for_user(request, slug, name)
    if do_close_rejoin(node, actor=request.user, reason=f"by {request.user.get_username()}",
                       request=request):
        messages.success(request, f"{node.name} is closed to re-join.")
    else:
        messages.info(request, f"{node.name} was not open to re-join.")
    return redirect(node)


@require_POST
@require_role(Role.ADMIN)
def node_remove(request, slug, name):
    """The node leaves the console: its agent's connection is closed, its tokens revoked,
    its history deleted (the audit trail keeps the record)."""
    node = get_node_for_user(request, slug, name)
    form = RemoveNodeForm(request.POST)
    if not form.is_valid():
        messages.error(request, " ".join(form.errors["reason"]))
        return redirect(node)
    if not do_remove_node(node, actor=request.user, reason=form.cleaned_data["reason"],
                          request=request):
        messages.error(request, f"{node.name} has a repair running: abort it first.")
        return redirect(node)
    messages.success(request, f"{node.name} removed.")
    return redirect("nodes:list", node.cluster.slug)


@require_POST
@require_role(Role.ADMIN)
def node_set_role(request, slug, name):
    """The role picks the node's startup scripts; its agent gets them at once if connected."""
    node = get_node_for_user(request, slug, name)
    form = NodeRoleForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"{node.name}: role not changed. {' '.join(form.errors['role'])}")
    elif do_set_node_role(node, form.cleaned_data["role"], actor=request.user, request=request):
        messages.success(request, f"{node.name} is now a {node.role} node: it runs the "
                                  f"{node.role} startup scripts.")
    else:
        messages.info(request, f"{node.name} was already a {node.role} node.")
    if not request.htmx:
        return redirect(node)
    context = {"cluster": node.cluster, "node": node, "node_roles": NodeRole.choices,
               "role_response": True}
    return render(request, "nodes/detail.html#node-role", context)


@require_POST
@require_role(Role.OPERATOR)
def bulk_pause(request, slug):
    cluster = get_cluster_for_user(request, slug)
    form = BulkPauseForm(request.POST, cluster=cluster)
    if form.is_valid():
        paused = do_bulk_pause_nodes(form.cleaned_data["nodes"], actor=request.user,
                                     reason=form.cleaned_data["reason"], request=request)
        messages.success(request, bulk_summary("paused", paused, "already paused"))
    return bulk_response(request, cluster, form)


@require_POST
@require_role(Role.OPERATOR)
def bulk_resume(request, slug):
    cluster = get_cluster_for_user(request, slug)
    form = BulkNodesForm(request.POST, cluster=cluster)
    if form.is_valid():
        resumed = do_bulk_resume_nodes(form.cleaned_data["nodes"], actor=request.user,
                                       request=request)
        messages.success(request, bulk_summary("resumed", resumed, "not paused"))
    return bulk_response(request, cluster, form)


@require_POST
@require_role(Role.ADMIN)
def bulk_set_role(request, slug):
    cluster = get_cluster_for_user(request, slug)
    form = BulkRoleForm(request.POST, cluster=cluster)
    if form.is_valid():
        role = form.cleaned_data["role"]
        changed = do_bulk_set_node_role(form.cleaned_data["nodes"], role, actor=request.user,
                                        request=request)
        messages.success(request, bulk_summary(f"set the role to {role} on", changed,
                                           f"already {role}"))
    return bulk_response(request, cluster, form)



# Cluster settings > Maintenance windows. Operators make and end windows over nodes; a
# window over the whole cluster (which pauses every repair in it) needs an admin.


def _may_change_window(request, whole_cluster):
    if whole_cluster and not has_role(request.user, Role.ADMIN):
        raise PermissionDenied("A window over the whole cluster needs the admin role.")


@require_http_methods(["GET", "POST"])
@require_role(Role.VIEWER)
def maintenance(request, slug):
    cluster = get_cluster_for_user(request, slug)
    if request.method == "POST" and not has_role(request.user, Role.OPERATOR):
        raise PermissionDenied("Maintenance windows need the operator role.")
    form = MaintenanceWindowForm(request.POST or None, cluster=cluster)
    if request.method == "POST" and form.is_valid():
        _may_change_window(request, whole_cluster=not form.cleaned_data["nodes"])
        window = do_create_maintenance_window(
            cluster, reason=form.cleaned_data["reason"], nodes=form.cleaned_data["nodes"],
            starts_at=form.cleaned_data["starts_at"], ends_at=form.cleaned_data["ends_at"],
            cron=form.cleaned_data["cron"], duration_minutes=form.cleaned_data["duration_minutes"],
            actor=request.user, request=request)
        messages.success(request, f"Maintenance window #{window.pk} saved.")
        return redirect("nodes:maintenance", cluster.slug)
    return render(request, "nodes/maintenance.html",
                  {"cluster": cluster, "tab": "settings", "form": form,
                   "windows": maintenance_windows(cluster)},
                  status=400 if form.errors else 200)


@require_POST
@require_role(Role.OPERATOR)
def maintenance_end(request, slug, window_id):
    cluster = get_cluster_for_user(request, slug)
    window = get_object_or_404(MaintenanceWindow, cluster=cluster, pk=window_id)
    _may_change_window(request, whole_cluster=window.whole_cluster)
    if do_end_maintenance_window(window, actor=request.user, request=request):
        messages.success(request, f"Maintenance window #{window.pk} ended.")
    else:
        messages.info(request, f"Maintenance window #{window.pk} had already ended.")
    return redirect("nodes:maintenance", cluster.slug)


@require_POST
@require_role(Role.OPERATOR)
def maintenance_change(request, slug, window_id):
    cluster = get_cluster_for_user(request, slug)
    window = get_object_or_404(MaintenanceWindow, cluster=cluster, pk=window_id)
    _may_change_window(request, whole_cluster=window.whole_cluster)
    form = MaintenanceWindowChangeForm(request.POST, window=window)
    if not form.is_valid():
        messages.error(request, " ".join(error for errors in form.errors.values()
                                         for error in errors))
    else:
        changed = do_update_maintenance_window(window, reason=form.cleaned_data["reason"],
                                               ends_at=form.cleaned_data["ends_at"],
                                               actor=request.user, request=request)
        messages.success(request, f"Window #{window.pk}: changed {', '.join(changed)}."
                         if changed else f"Window #{window.pk}: nothing changed.")
    return redirect("nodes:maintenance", cluster.slug)


# Diagnostic bundles (nodes/bundles.py).

BUNDLES_SHOWN = 10


def node_bundles(node):
    """The node's latest bundles, each settled (one whose agent gave up says so)."""
    return [settle(bundle) for bundle in node.bundles.select_related("requested_by")
            [:BUNDLES_SHOWN]]


@require_POST
@require_role(Role.OPERATOR)
def bundle_request(request, slug, name):
    """Ask the node's agent for a diagnostic bundle, with no repair."""
    node = get_node_for_user(request, slug, name)
    bundle = do_request_bundle(node, reason=f"asked by {request.user.get_username()}",
                               actor=request.user, request=request)
    messages.success(request, f"A diagnostic bundle was asked of {node.name}'s agent; it has "
                              f"{bundle.deadline_s} s to send it.")
    return redirect(f"{node.get_absolute_url()}#node-bundles")


@require_GET
@require_role(Role.OPERATOR)
def bundle_download(request, slug, name, public_id):
    """The stored bundle's file (operators; viewers see that it exists). Audited."""
    node = get_node_for_user(request, slug, name)
    bundle = get_object_or_404(DiagnosticBundle, node=node, public_id=public_id)
    if bundle.status != DiagnosticBundle.Status.STORED:
        raise Http404(f"bundle {public_id} is {bundle.get_status_display()}")
    return FileResponse(do_download_bundle(bundle, actor=request.user, request=request),
                        as_attachment=True, filename=bundle.filename,
                        content_type="application/gzip")
