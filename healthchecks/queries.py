"""The reads behind the Health checks tab and what other pages show of health: open events
per signature, each node's worst open signal, a page of check runs."""

from django.core.paginator import Paginator
from django.db.models import Case, Count, Max, Value, When

from common.durations import duration_text
from nodes.models import NodeRollup

from .choices import Severity
from .models import HealthEvent
from .signatures import HELD, info_for


def open_events_by_signature(cluster):
    """Per signature, the cluster's open events: how many, on how many nodes, and the worst
    severity among them; worst first. One query."""
    rank = Case(*[When(severity=s, then=Value(i)) for i, s in enumerate(Severity.values)])
    rows = (HealthEvent.objects.open().filter(node__cluster=cluster).values("signature")
            .annotate(events=Count("id"), nodes=Count("node", distinct=True), worst=Max(rank))
            .order_by("-worst", "-events", "signature"))
    return [{**row, "severity": Severity.values[row["worst"]]} for row in rows]


SEVERITY_RANK = {Severity.CRITICAL: 0, Severity.WARNING: 1, Severity.INFO: 2}
# The Health checks tab's order: critical first, then warning, then info; newest first.
EVENTS_WORST_FIRST = (
    Case(*[When(severity=s, then=Value(rank)) for s, rank in SEVERITY_RANK.items()]),
    "-last_seen", "-id")


def worst_open_events(cluster, node_ids=None):
    """{node id: (severity rank, "xid:79 on GPU 3", its message)} for each node's worst open
    event (critical first, then the oldest). One query, for the given nodes or the whole
    cluster."""
    events = HealthEvent.objects.open().filter(node__cluster=cluster)
    if node_ids is not None:
        events = events.filter(node_id__in=node_ids)
    worst = {}
    for node_id, signature, severity, gpu_index, message in (
            events.order_by("first_seen", "id").values_list(
                "node_id", "signature", "severity", "gpu__index", "message")):
        rank = SEVERITY_RANK.get(severity, 3)
        if node_id not in worst or rank < worst[node_id][0]:
            text = signature if gpu_index is None else f"{signature} on GPU {gpu_index}"
            worst[node_id] = (rank, text, message)
    return worst


def worst_open_signals(cluster, node_ids=None):
    """{node id: "xid:79 on GPU 3"}: worst_open_events' signals."""
    return {node_id: text for node_id, (_, text, _) in
            worst_open_events(cluster, node_ids).items()}


PEAK_UNITS = {"temp_c": "°C", "power_w": "W"}


def held_signal_text(event, now):
    """For a held signal (throttling, a Slurm drain, ECC rising): how long it has been held,
    and its peak where the catalog names a metric ("held 16 min, up to 88 °C"), from the
    reading at its opening and the node's per-minute rollups of that GPU. "" for an edge
    signal or a notice."""
    info = info_for(event.signature)
    if info is None or info.kind != HELD:
        return ""
    end = event.closed_at or now
    text = f"held {duration_text((end - event.first_seen).total_seconds())}"
    if not info.peak or event.gpu is None:
        return text
    at_opening = (event.evidence or {}).get(info.peak)
    peak = at_opening if isinstance(at_opening, (int, float)) else None
    for gpus in NodeRollup.objects.filter(
            node_id=event.node_id, minute__gte=event.first_seen.replace(second=0, microsecond=0),
            minute__lte=end).values_list("gpus", flat=True):
        mean_max = (gpus.get(event.gpu.uuid) or {}).get(info.peak)
        if mean_max and mean_max[1] is not None:
            peak = mean_max[1] if peak is None else max(peak, mean_max[1])
    if peak is None:
        return text
    return f"{text}, up to {peak:.0f} {PEAK_UNITS[info.peak]}"


RUNS_PAGE_SIZE = 50


def check_runs_context(cluster, runs, params, page_number=None, node=None):
    """The check-run table's context: a page of `runs`, and the query it re-fetches itself
    with when the live socket says a check run changed ("check.changed")."""
    page = Paginator(runs, RUNS_PAGE_SIZE).get_page(page_number)
    return {"cluster": cluster, "runs_page": page, "runs_node": node,
            "runs_refresh_query": params.urlencode()}
