"""The reads behind the Nodes tab and the node page: the node a URL names, the list or grid
with live numbers (one read of the live store), the node page's charts, SSH command and
GPUs. Health's parts of these pages (worst open signals, events, checks) come from its
template tags (healthchecks/templatetags/health.py)."""

import time
from collections import Counter
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.core.paginator import Paginator
from django.db.models import Count, Q
from django.http import HttpRequest
from django.shortcuts import get_object_or_404
from django.utils import timezone

from clusters.models import SSH_PLACEHOLDER
from clusters.queries import get_cluster_for_user

from . import maintenance
from .choices import DISPLAY_ORDER, NodeRole
from .filters import DB_SORTS, DEFAULT_SORT, LIVE_SORTS, SORT_CHOICES, NodeFilter
from .live_store import get_live_store, stale_after_s
from .models import AgentCommand, MaintenanceWindow, Node, NodeRollup
from .rollups import reading
from .wheelhouse import agent_is_behind, console_agent_version

NODES_PAGE_SIZE = 50
# The grid labels its tiles with the nodes' names up to this many nodes (a 1440x900 screen
# still shows them all); beyond, the tiles are small squares, a name on pointing.
GRID_LABELS_UP_TO = 200
CHART_METRICS = ("util_pct", "sm_active_pct", "mem_used_bytes", "temp_c", "power_w")


def get_node_for_user(request: HttpRequest, slug: str, name: str) -> Node:
    cluster = get_cluster_for_user(request, slug)
    return get_object_or_404(Node.objects.select_related("cluster"), cluster=cluster, name=name)


def node_list_context(cluster, params):
    """The Nodes tab's list or grid for `params` (filters, sort, view, page): its nodes with
    their live numbers (one read of the live store)."""
    nodes = Node.objects.filter(cluster=cluster).annotate(
        gpu_count=Count("gpus", filter=Q(gpus__removed_at__isnull=True)))
    node_filter = NodeFilter(params, queryset=nodes)
    matching = node_filter.qs if node_filter.is_valid() else nodes.none()
    view = "grid" if params.get("view") == "grid" else "list"
    sort = params.get("sort") if params.get("sort") in dict(SORT_CHOICES) else DEFAULT_SORT
    live = live_numbers(cluster)
    legend = None
    labelled = False
    if view == "grid":
        page = None
        shown = list(matching.order_by("name").only("name", "state"))
        counts = Counter(node.state for node in shown)
        legend = [(state.value, state.label, counts[state.value]) for state in DISPLAY_ORDER]
        labelled = len(shown) <= GRID_LABELS_UP_TO
    elif sort in LIVE_SORTS:
        page = _page_by_live_number(matching, live, sort, params.get("page"))
        shown = page.object_list
    else:
        page = Paginator(matching.order_by(*DB_SORTS[sort]), NODES_PAGE_SIZE).get_page(
            params.get("page"))
        shown = page.object_list
    agent_release = console_agent_version()
    for node in shown:
        node.live = live.get(node.pk)
        node.agent_behind = view == "list" and agent_is_behind(node.agent_version, agent_release)
        # The grid tile's fill: utilization in tenths (class u0..u10; none without a sample).
        util = node.live and node.live["util_mean"]
        node.fill = None if util is None else min(10, max(0, round(util / 10)))
    query = params.copy()
    query.pop("page", None)
    return {"filter": node_filter, "page": page, "nodes": shown, "view": view, "sort": sort,
            "legend": legend, "labelled": labelled, "agent_release": agent_release,
            "sort_choices": SORT_CHOICES, "list_query": query.urlencode(),
            "node_roles": NodeRole.choices,
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
        return [gpu[field] for gpu in gpus if reading(gpu.get(field)) is not None]

    utils, temps, power = values("util_pct"), values("temp_c"), values("power_w")
    with_total = [gpu for gpu in gpus if reading(gpu.get("mem_used_bytes")) is not None
                  and reading(gpu.get("mem_total_bytes"))]
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


def chart_series(node, since):
    """{"gpus": [{index, uuid, memory_total_bytes}], "minute": [...], "series": {uuid:
    {metric: [mean, ...]}}}: one list per GPU and metric, aligned with "minute" (null where a
    minute lacks it). The memory total sets the memory chart's axis."""
    gpus = list(node.gpus.in_inventory().values("index", "uuid", "memory_total_bytes"))
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


def ssh_command(node, user):
    """The cluster's SSH command template filled in for this node and the signed-in user.
    Only the four placeholders are replaced (the template is validated to hold no other)."""
    values = {"user": user.get_username(), "node": node.name,
              "hostname": node.hostname or node.name, "login": node.cluster.ssh_login_host}
    return SSH_PLACEHOLDER.sub(lambda match: values[match.group(1)],
                               node.cluster.ssh_command_template)


def gpu_inventory_context(node):
    """The node page's GPUs (health's tag adds how the latest hello differs from them)."""
    return {"gpus": node.gpus.in_inventory()}


def grafana_url(node):
    template = node.cluster.grafana_url_template or settings.CLUSTERUI_GRAFANA_NODE_URL
    return template.format(node=node.name, cluster=node.cluster.slug) if template else ""


def maintenance_windows(cluster, now=None):
    """The cluster's windows, each with `on_now` (its current occurrence or None) and
    `over_now` (ended, or past its end), newest first; the last 50."""
    now = now or timezone.now()
    windows = list(MaintenanceWindow.objects.filter(cluster=cluster)
                   .prefetch_related("nodes")[:50])
    for window in windows:
        window.on_now = maintenance.occurrence_at(window, now)
        window.over_now = (window.ended_at is not None and window.ended_at <= now) or (
            window.ends_at is not None and window.ends_at <= now)
        window.node_names = sorted(node.name for node in window.nodes.all())
    return windows


# The node page's hygiene panel (issue 17): what the agent reports of slurmd, the process
# table and Slurm's GPUs, and what the job ends and clean-ups did.
HYGIENE_EVENTS = ("slurmd_down", "slurmd_flapping", "zombie_processes", "pid_pressure",
                  "job_leftovers", "gres_drift")
JOB_CLEANUPS_SHOWN = 10
SLURMD_RESTARTS_SHOWN = 5


def _from_timestamp(value):
    if value is None:
        return None
    return datetime.fromtimestamp(value, tz=UTC)


def hygiene_context(node, now=None):
    """The latest hygiene readings (the live entry's; `hygiene_stale` once the node stopped
    reporting), the open hygiene events, the recent slurmd restarts and job-end cleanups,
    and the latest clean-up command."""
    now = now or timezone.now()
    entry = get_live_store().read_node(node.cluster_id, node.pk)
    hygiene = (entry or {}).get("hygiene") or {}
    slurmd = hygiene.get("slurmd")
    events = node.health_events
    restarts = events.filter(signature="slurmd_restarted",
                             first_seen__gte=now - timedelta(hours=24))
    cleanup = (node.agent_commands.filter(action=AgentCommand.Action.CLEANUP)
               .select_related("requested_by").order_by("-id").first())
    context = {
        "hygiene": hygiene,
        "hygiene_stale": bool(entry) and time.time() - entry["received_at"] > stale_after_s(),
        "slurmd": slurmd,
        "slurmd_since": _from_timestamp((slurmd or {}).get("since")),
        "slurmd_restarts_24h": restarts.count(),
        "slurmd_restarts": list(restarts.order_by("-first_seen")[:SLURMD_RESTARTS_SHOWN]),
        "processes": hygiene.get("processes"),
        "gres": hygiene.get("gres"),
        "hygiene_events": {event.signature: event for event in
                           events.open().filter(signature__in=HYGIENE_EVENTS)},
        "job_cleanups": [job_cleanup_row(event) for event in events.filter(
            signature="job_cleanup").order_by("-first_seen")[:JOB_CLEANUPS_SHOWN]],
        "cleanup_command": cleanup,
    }
    processes = context["processes"] or {}
    if processes.get("tasks") is not None and processes.get("pid_max"):
        context["pid_pct"] = round(100 * processes["tasks"] / processes["pid_max"], 1)
    context["hygiene_shown"] = bool(
        hygiene or node.slurm_state or context["hygiene_events"] or context["job_cleanups"]
        or cleanup)
    return context


def _how_many(report, count_key, list_key):
    """How many: the report's count (its lists are cut to stay under PROTOCOL.md's 16 KiB),
    else the length of its list, else a number where the list would be."""
    for value in (report.get(count_key), report.get(list_key)):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    value = report.get(list_key)
    return len(value) if isinstance(value, list) else 0


def job_cleanup_row(event):
    """One job end on the node page, from its job_cleanup notice (agent.hygiene.job_cleanup's
    report)."""
    report = event.evidence
    return {
        "at": event.first_seen,
        "job_id": report.get("job_id"),
        "user": report.get("user"),
        "method": report.get("method"),
        "found": _how_many(report, "found", "processes"),
        "ended": _how_many(report, "ended_count", "ended"),
        "killed": _how_many(report, "killed_count", "killed"),
        "left": _how_many(report, "left_count", "left"),
        "gpu_processes": report.get("gpu_processes") or [],
        "gpu_check": report.get("gpu_check"),
        "shm_removed": _how_many(report, "shm_removed_files", "shm_removed"),
        "shm_removed_bytes": report.get("shm_removed_bytes") or 0,
        "shm_skipped": report.get("shm_skipped"),
        "message": event.message,
    }
