import hmac
import time
from datetime import timedelta

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_not_required
from django.http import HttpResponse, JsonResponse, QueryDict
from django.core.paginator import Paginator
from django.db.models import Count, Q
from django.db import transaction
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from clusterui.models import SSH_PLACEHOLDER
from clusterui.roles import Role, require_role
from clusterui.views import get_cluster_for_user
from healthchecks.choices import Severity
from healthchecks.forms import RunCheckForm
from healthchecks.inventory import do_accept_gpu_inventory, review_gpu_inventory
from healthchecks.models import HealthEvent
from healthchecks.services import do_request_checks
from healthchecks.views import check_runs_context, open_events_by_signature
from repairs.views import node_repairs_context

from .filters import DB_SORTS, LIVE_SORTS, SORT_CHOICES, NodeFilter
from .forms import (
    BulkCheckForm,
    BulkNodesForm,
    BulkPauseForm,
    BulkRoleForm,
    NodeRoleForm,
    PauseNodeForm,
)
from .live import get_live_store
from .metrics import render_metrics
from .models import Node, NodeRollup
from .publisher import stale_after_s
from .script_models import NodeRole
from .services import (
    do_pause_node,
    do_resume_node,
    do_set_node_role,
)

NODES_PAGE_SIZE = 50


def get_node_for_user(request, slug, name):
    cluster = get_cluster_for_user(request, slug)
    return get_object_or_404(Node.objects.select_related("cluster"), cluster=cluster, name=name)


@require_GET
@require_role(Role.VIEWER)
def node_list(request, slug):
    cluster = get_cluster_for_user(request, slug)
    context = {"cluster": cluster, "tab": "nodes", **node_list_context(cluster, request.GET)}
    return render(request, "nodes/list.html" + ("#node-table" if request.htmx else ""), context)


def node_list_context(cluster, params):
    """The Nodes tab's list or grid for `params` (filters, sort, view, page): its nodes with
    their live numbers (one read of the live store) and worst open signal (one query)."""
    nodes = Node.objects.filter(cluster=cluster).annotate(
        gpu_count=Count("gpus", filter=Q(gpus__removed_at__isnull=True)))
    node_filter = NodeFilter(params, queryset=nodes)
    matching = node_filter.qs if node_filter.is_valid() else nodes.none()
    view = "grid" if params.get("view") == "grid" else "list"
    sort = params.get("sort") if params.get("sort") in dict(SORT_CHOICES) else "name"
    live = live_numbers(cluster)
    if view == "grid":
        page = None
        shown = list(matching.order_by("name").only("name", "state"))
    elif sort in LIVE_SORTS:
        page = _page_by_live_number(matching, live, sort, params.get("page"))
        shown = page.object_list
    else:
        page = Paginator(matching.order_by(*DB_SORTS[sort]), NODES_PAGE_SIZE).get_page(
            params.get("page"))
        shown = page.object_list
    signals = worst_open_signals(cluster, [node.pk for node in shown] if page else None)
    for node in shown:
        node.live = live.get(node.pk)
        node.worst_signal = signals.get(node.pk, "")
        # The grid tile's fill: utilization in tenths (class u0..u10; none without a sample).
        util = node.live and node.live["util_mean"]
        node.fill = None if util is None else min(10, max(0, round(util / 10)))
    query = params.copy()
    query.pop("page", None)
    return {"filter": node_filter, "page": page, "nodes": shown, "view": view, "sort": sort,
            "sort_choices": SORT_CHOICES, "list_query": query.urlencode(),
            "bulk_checks": RunCheckForm(cluster=None).fields["check"].choices,
            "node_roles": NodeRole.choices,
            "open_signatures": [row["signature"] for row in open_events_by_signature(cluster)],
            "filtered": any(params.get(key) for key in NodeFilter.base_filters)}


def _page_by_live_number(matching, live, sort, page_number):
    """A page of nodes sorted by a live number, highest first; nodes without one last."""
    key = "util_mean" if sort == "util" else "temp_max"
    ids = list(matching.order_by("name").values_list("pk", flat=True))
    ids.sort(key=lambda pk: -(live.get(pk, {}).get(key) or -1))
    page = Paginator(ids, NODES_PAGE_SIZE).get_page(page_number)
    by_id = matching.in_bulk(page.object_list)
    page.object_list = [by_id[pk] for pk in page.object_list]
    return page


def live_numbers(cluster, now_ts=None):
    """{node id: its GPUs' numbers now} from one read of the live store; fresh samples only."""
    now_ts = time.time() if now_ts is None else now_ts
    stale = stale_after_s()
    return {node_id: summarize_node_sample(entry)
            for node_id, entry in get_live_store().read(cluster.pk).items()
            if now_ts - entry["received_at"] <= stale}


def summarize_node_sample(entry):
    """Mean and max GPU utilization, GPU memory used, hottest GPU and total power of a sample."""
    gpus = entry["gpus"]

    def values(field):
        return [gpu[field] for gpu in gpus if gpu.get(field) is not None]

    utils, temps, power = values("util_pct"), values("temp_c"), values("power_w")
    with_total = [gpu for gpu in gpus if gpu.get("mem_used_bytes") is not None
                  and gpu.get("mem_total_bytes")]
    used = sum(gpu["mem_used_bytes"] for gpu in with_total)
    total = sum(gpu["mem_total_bytes"] for gpu in with_total)
    return {
        "util_mean": sum(utils) / len(utils) if utils else None,
        "util_max": max(utils) if utils else None,
        "mem_used_bytes": used if total else None,
        "mem_total_bytes": total or None,
        "mem_used_pct": 100.0 * used / total if total else None,
        "temp_max": max(temps) if temps else None,
        "power_w": sum(power) if power else None,
    }


SEVERITY_RANK = {Severity.CRITICAL: 0, Severity.WARNING: 1, Severity.INFO: 2}


def worst_open_signals(cluster, node_ids=None):
    """{node id: "xid:79 on GPU 3"} for each node's worst open event (critical first, then
    the oldest). One query, for the given nodes or the whole cluster."""
    events = HealthEvent.objects.open().filter(node__cluster=cluster)
    if node_ids is not None:
        events = events.filter(node_id__in=node_ids)
    worst = {}
    for node_id, signature, severity, gpu_index in events.order_by("first_seen", "id").values_list(
            "node_id", "signature", "severity", "gpu__index"):
        rank = SEVERITY_RANK.get(severity, 3)
        if node_id not in worst or rank < worst[node_id][0]:
            text = signature if gpu_index is None else f"{signature} on GPU {gpu_index}"
            worst[node_id] = (rank, text)
    return {node_id: text for node_id, (rank, text) in worst.items()}


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
        "node_roles": NodeRole.choices,
        "grafana_url": grafana_url(node),
        "run_form": RunCheckForm(cluster=node.cluster),
        **check_runs_context(node.cluster, node.check_runs.select_related(
            "node", "requested_by", "health_event"), QueryDict(f"node={node.name}"), node=node),
        **node_repairs_context(node),
        "ssh_command": ssh_command(node, request.user),
        "chart_range": request.GET.get("range") if request.GET.get("range") in CHART_RANGES
        else "hour",
    }
    return render(request, "nodes/detail.html", context)


CHART_RANGES = {"hour": timedelta(hours=1), "day": timedelta(days=1)}
CHART_METRICS = ("util_pct", "mem_used_bytes", "temp_c", "power_w")


@require_GET
@require_role(Role.VIEWER)
def node_charts(request, slug, name):
    """The node page's charts: per GPU, the per-minute means of the last hour or day."""
    node = get_node_for_user(request, slug, name)
    span = request.GET.get("range") if request.GET.get("range") in CHART_RANGES else "hour"
    return JsonResponse(chart_series(node, timezone.now() - CHART_RANGES[span]))


def chart_series(node, since):
    """{"gpus": [{index, uuid}], "minute": [...], "series": {uuid: {metric: [mean, ...]}}}:
    one list per GPU and metric, aligned with "minute" (null where a minute lacks it)."""
    gpus = list(node.gpus.in_inventory().values("index", "uuid"))
    rows = list(NodeRollup.objects.filter(node=node, minute__gte=since).order_by("minute")
                .values_list("minute", "gpus"))
    series = {gpu["uuid"]: {metric: [] for metric in CHART_METRICS} for gpu in gpus}
    for _, by_uuid in rows:
        for uuid, metrics in series.items():
            pairs = by_uuid.get(uuid) or {}
            for metric, values in metrics.items():
                mean = (pairs.get(metric) or [None])[0]
                values.append(None if mean is None else round(mean, 1))
    return {"gpus": gpus, "minute": [minute.isoformat() for minute, _ in rows],
            "series": series}


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


def ssh_command(node, user):
    """The cluster's SSH command template filled in for this node and the signed-in user.
    Only the four placeholders are replaced (the template is validated to hold no other)."""
    values = {"user": user.get_username(), "node": node.name,
              "hostname": node.hostname or node.name, "login": node.cluster.ssh_login_host}
    return SSH_PLACEHOLDER.sub(lambda match: values[match.group(1)],
                               node.cluster.ssh_command_template)


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
        with transaction.atomic():
            paused = [do_pause_node(node, actor=request.user, request=request,
                                    reason=form.cleaned_data["reason"])
                      for node in form.cleaned_data["nodes"]]
        messages.success(request, _summary("paused", paused, "already paused"))
    return _bulk_response(request, cluster, form)


@require_POST
@require_role(Role.OPERATOR)
def bulk_resume(request, slug):
    cluster = get_cluster_for_user(request, slug)
    form = BulkNodesForm(request.POST, cluster=cluster)
    if form.is_valid():
        with transaction.atomic():
            resumed = [do_resume_node(node, actor=request.user, request=request)
                       for node in form.cleaned_data["nodes"]]
        messages.success(request, _summary("resumed", resumed, "not paused"))
    return _bulk_response(request, cluster, form)


@require_POST
@require_role(Role.OPERATOR)
def bulk_check(request, slug):
    cluster = get_cluster_for_user(request, slug)
    form = BulkCheckForm(request.POST, cluster=cluster)
    if form.is_valid():
        names, purpose = form.checks_and_purpose()
        with transaction.atomic():
            started = [all(created for _, created in do_request_checks(
                node, names, purpose=purpose, actor=request.user, request=request))
                for node in form.cleaned_data["nodes"]]
        messages.success(request, _summary(f"started {form.cleaned_data['check']} on", started,
                                           "already running it"))
    return _bulk_response(request, cluster, form)


@require_POST
@require_role(Role.ADMIN)
def bulk_set_role(request, slug):
    cluster = get_cluster_for_user(request, slug)
    form = BulkRoleForm(request.POST, cluster=cluster)
    if form.is_valid():
        role = form.cleaned_data["role"]
        with transaction.atomic():
            changed = [do_set_node_role(node, role, actor=request.user, request=request)
                       for node in form.cleaned_data["nodes"]]
        messages.success(request, _summary(f"set the role to {role} on", changed,
                                           f"already {role}"))
    return _bulk_response(request, cluster, form)


def _summary(done, outcomes, otherwise):
    """'paused 5; 2 were already paused' from one boolean per node."""
    changed = sum(outcomes)
    text = f"{done.capitalize()} {changed} node{'s' if changed != 1 else ''}"
    unchanged = len(outcomes) - changed
    if unchanged:
        text += f"; {unchanged} {'was' if unchanged == 1 else 'were'} {otherwise}"
    return text + "."


def _bulk_response(request, cluster, form):
    """After a bulk operation: htmx swaps the list (with the same filters, from the query
    string) and the messages; a plain form goes back to the list."""
    for errors in form.errors.values():
        messages.error(request, " ".join(errors))
    if not request.htmx:
        query = request.GET.urlencode()
        return redirect(reverse("nodes:list", args=[cluster.slug]) + (f"?{query}" if query else ""))
    context = {"cluster": cluster, "tab": "nodes", "bulk_response": True,
               **node_list_context(cluster, request.GET)}
    return render(request, "nodes/list.html#node-table", context)


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
