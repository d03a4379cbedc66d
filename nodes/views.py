import hmac
import time

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_not_required
from django.http import HttpResponse, QueryDict
from django.core.paginator import Paginator
from django.db.models import Count, Q
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from clusterui.roles import Role, require_role
from clusterui.views import get_cluster_for_user
from healthchecks.forms import RunCheckForm
from healthchecks.views import check_runs_context
from repairs.views import node_repairs_context

from .filters import NodeFilter
from .forms import PauseNodeForm
from .metrics import render_metrics
from .models import Node
from .services import (
    do_accept_gpu_inventory,
    do_pause_node,
    do_resume_node,
    review_gpu_inventory,
)

NODES_PAGE_SIZE = 50


def get_node_for_user(request, slug, name):
    cluster = get_cluster_for_user(request, slug)
    return get_object_or_404(Node.objects.select_related("cluster"), cluster=cluster, name=name)


@require_GET
@require_role(Role.VIEWER)
def node_list(request, slug):
    cluster = get_cluster_for_user(request, slug)
    nodes = Node.objects.filter(cluster=cluster).annotate(
        gpu_count=Count("gpus", filter=Q(gpus__removed_at__isnull=True))).order_by("name")
    node_filter = NodeFilter(request.GET, queryset=nodes)
    matching = node_filter.qs if node_filter.is_valid() else nodes.none()
    page = Paginator(matching, NODES_PAGE_SIZE).get_page(request.GET.get("page"))
    context = {"cluster": cluster, "tab": "nodes", "filter": node_filter, "page": page}
    return render(request, "nodes/list.html" + ("#node-table" if request.htmx else ""), context)


@require_GET
@require_role(Role.VIEWER)
def node_detail(request, slug, name):
    node = get_node_for_user(request, slug, name)
    context = {
        "cluster": node.cluster,
        "tab": "nodes",
        "node": node,
        **gpu_inventory_context(node),
        "open_events": node.health_events.open().select_related("gpu"),
        "transitions": node.transitions.all()[:50],
        "pause_form": PauseNodeForm(),
        "grafana_url": grafana_url(node),
        "run_form": RunCheckForm(cluster=node.cluster),
        **check_runs_context(node.cluster, node.check_runs.select_related(
            "node", "requested_by", "health_event"), QueryDict(f"node={node.name}"), node=node),
        **node_repairs_context(node),
    }
    return render(request, "nodes/detail.html", context)


def gpu_inventory_context(node):
    return {"gpus": node.gpus.in_inventory(), "inventory_review": review_gpu_inventory(node)}


def grafana_url(node):
    template = settings.CLUSTERUI_GRAFANA_NODE_URL
    return template.format(node=node.name, cluster=node.cluster.slug) if template else ""


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
    return _node_status_or_redirect(request, node)


@require_POST
@require_role(Role.OPERATOR)
def node_resume(request, slug, name):
    node = get_node_for_user(request, slug, name)
    if do_resume_node(node, actor=request.user, request=request):
        messages.success(request, f"{node.name} resumed.")
    else:
        messages.info(request, f"{node.name} was not paused.")
    return _node_status_or_redirect(request, node)


@require_POST
@require_role(Role.OPERATOR)
def node_accept_gpu_inventory(request, slug, name):
    """The node's latest hello becomes its GPU inventory (DESIGN.md: gpu_lost)."""
    node = get_node_for_user(request, slug, name)
    review = do_accept_gpu_inventory(node, actor=request.user, request=request)
    if review.acceptable:
        closed = len(review.gpu_lost)
        messages.success(request, f"{node.name}: GPU inventory accepted"
                         + (f", {closed} gpu_lost closed." if closed else "."))
    else:
        messages.info(request, f"{node.name}: nothing to accept"
                      + (f" ({review.problem})." if review.problem else "."))
    if not request.htmx:
        return redirect(node)
    context = {"cluster": node.cluster, "node": node, "inventory_response": True,
               **gpu_inventory_context(node)}
    return render(request, "nodes/detail.html#gpu-inventory", context)


def _node_status_or_redirect(request, node):
    """After an operation: htmx swaps the node's status panel; a plain form goes back."""
    if not request.htmx:
        return redirect(node)
    node.refresh_from_db()
    context = {"cluster": node.cluster, "node": node, "pause_form": PauseNodeForm()}
    return render(request, "nodes/detail.html#node-status", context)


@login_not_required
@require_GET
def metrics(request):
    """Prometheus scrape endpoint; guarded by CLUSTERUI_METRICS_TOKEN (off when unset)."""
    expected = settings.CLUSTERUI_METRICS_TOKEN
    if not expected:
        return HttpResponse("metrics are off: set CLUSTERUI_METRICS_TOKEN\n", status=404,
                            content_type="text/plain")
    given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
    if not hmac.compare_digest(given.encode(), expected.encode()):
        return HttpResponse("bearer token required\n", status=401, content_type="text/plain",
                            headers={"WWW-Authenticate": "Bearer"})
    return HttpResponse(render_metrics(time.time()),
                        content_type="text/plain; version=0.0.4; charset=utf-8")
