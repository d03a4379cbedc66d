"""The reads behind the overview and the cluster list: counts by state, usage and the
timeline, in a fixed number of queries."""

from datetime import timedelta

from django.core.paginator import Paginator
from django.db.models import Count, Q
from django.utils import timezone

from healthchecks.models import CheckRun
from healthchecks.queries import SEVERITY_RANK, worst_open_events
from nodes import maintenance
from nodes.choices import DISPLAY_ORDER, OUT_OF_SERVICE, STATE_COLOURS, NodeState
from nodes.models import ClusterRollup, Node, NodeTransition
from nodes.wheelhouse import console_agent_version
from repairs.choices import Status
from repairs.models import Repair

from clusters.models import Cluster, ClusterTransition

TIMELINE_PAGE_SIZE = 25
USAGE_WINDOW = timedelta(hours=1)
# A rollup older than this is not "now": the overview says telemetry is stale.
USAGE_FRESH_FOR = timedelta(minutes=5)


def bits_per_s_in_gbps(bytes_per_s):
    return round(bytes_per_s * 8 / 1e9, 2)


def state_counts(cluster):
    rows = Node.objects.filter(cluster=cluster).values("state").annotate(n=Count("id"))
    by_state = {row["state"]: row["n"] for row in rows}
    return [
        {"state": state, "label": state.label, "count": by_state.get(state, 0),
         "colour": STATE_COLOURS[state]}
        for state in DISPLAY_ORDER
    ]


def degraded(cluster, counts):
    """{"out": n, "total": m} while the cluster is degraded (state_counts' counts), else None."""
    out = sum(c["count"] for c in counts if c["state"] in OUT_OF_SERVICE)
    total = sum(c["count"] for c in counts)
    return {"out": out, "total": total} if cluster.is_degraded(out, total) else None


def maintenance_now(cluster):
    """The maintenance occurrences on now in the cluster."""
    return maintenance.current([cluster.pk]).get(cluster.pk, [])


def nodes_in_acceptance(cluster):
    """How many of the cluster's nodes are running their acceptance tests now."""
    return (CheckRun.objects.unfinished()
            .filter(node__cluster=cluster, purpose=CheckRun.Purpose.ACCEPTANCE)
            .values("node").distinct().count())


def nodes_on_another_agent(cluster):
    """(how many of the cluster's nodes run another agent release than this console
    installs, that release): what an upgrade has left to roll out."""
    release = console_agent_version()
    count = (Node.objects.filter(cluster=cluster).exclude(agent_version="")
             .exclude(agent_version=release).count())
    return {"count": count, "release": release}


NEEDS_YOU_LIMIT = 15


def needs_you(cluster, limit=NEEDS_YOU_LIMIT):
    """The nodes unhealthy now, worst first (a critical signal before a warning, then the
    longest unhealthy): {"rows": [{"node", "signal", "message", "since", "repair"}], "total"},
    at most `limit` rows. `repair`: the node's open repair (what to review and approve), or
    None."""
    nodes = list(Node.objects.filter(cluster=cluster, state=NodeState.UNHEALTHY)
                 .only("id", "name", "state_changed_at", "state_reason"))
    worst = worst_open_events(cluster, [node.pk for node in nodes])
    repairs = {repair.node_id: repair
               for repair in Repair.objects.open().filter(node__in=nodes).order_by("pk")}
    rows = []
    for node in nodes:
        rank, signal, message = worst.get(node.pk, (len(SEVERITY_RANK), node.state_reason, ""))
        rows.append({"node": node, "signal": signal, "message": message, "rank": rank,
                     "since": node.state_changed_at, "repair": repairs.get(node.pk)})
    rows.sort(key=lambda row: (row["rank"], row["since"] or timezone.now(), row["node"].name))
    return {"rows": rows[:limit], "total": len(rows)}


def repairs_awaiting_approval(cluster):
    return Repair.objects.filter(cluster=cluster, status=Status.PROPOSED).count()


def usage(cluster, now=None):
    now = now or timezone.now()
    rollups = list(
        ClusterRollup.objects.filter(cluster=cluster, minute__gte=now - USAGE_WINDOW)
        .order_by("minute")
        .values("minute", "gpus_reporting", "gpu_util_pct", "gpu_mem_used_pct", "net_bps",
                "gpu_sm_active_pct")
    )
    latest = rollups[-1] if rollups and now - rollups[-1]["minute"] <= USAGE_FRESH_FOR else None
    if latest is not None:
        latest = {**latest, "net_gbps": bits_per_s_in_gbps(latest["net_bps"])}
    series = {
        "minute": [r["minute"].isoformat() for r in rollups],
        "gpu_util_pct": [round(r["gpu_util_pct"], 1) for r in rollups],
        "gpu_mem_used_pct": [round(r["gpu_mem_used_pct"], 1) for r in rollups],
        "net_gbps": [bits_per_s_in_gbps(r["net_bps"]) for r in rollups],
        "gpu_sm_active_pct": [None if r["gpu_sm_active_pct"] is None
                              else round(r["gpu_sm_active_pct"], 1) for r in rollups],
    }
    return {"latest": latest, "series": series}


# The state changes every node goes through on its way in: registered, its first hello, its
# boot window ending. The timeline leaves them out unless asked (or filtered by state).
ROUTINE_TRANSITIONS = (
    Q(to_state=NodeState.PENDING)
    | Q(from_state__in=("", NodeState.PENDING), to_state=NodeState.BOOTING)
    | Q(from_state=NodeState.BOOTING, to_state=NodeState.HEALTHY)
)


def timeline_page(cluster, *, node_name="", state="", routine=False, page=1):
    """The cluster's timeline, newest first: its nodes' state changes and, unless filtered
    by node or state, its own status changes (ClusterTransition, whose `node` is None)."""
    transitions = NodeTransition.objects.filter(cluster=cluster).select_related("node")
    if node_name:
        transitions = transitions.filter(node__name__icontains=node_name)
    if state:
        transitions = transitions.filter(to_state=state)
    elif not routine:
        transitions = transitions.exclude(ROUTINE_TRANSITIONS)
    rows = [transitions.order_by("-at", "-id")]
    if not node_name and not state:
        rows.append(ClusterTransition.objects.filter(cluster=cluster).order_by("-at", "-id"))
    return Paginator(NewestFirst(rows), TIMELINE_PAGE_SIZE).get_page(page)


class NewestFirst:
    """Querysets ordered newest first, read as one sequence (what a Paginator needs): a page
    reads as many rows of each as the page's end, and merges them by time."""

    def __init__(self, querysets):
        self.querysets = querysets

    def count(self):
        return sum(queryset.count() for queryset in self.querysets)

    def __getitem__(self, index):
        if not isinstance(index, slice):
            return self[index:index + 1][0]
        merged = sorted((row for queryset in self.querysets for row in queryset[:index.stop]),
                        key=lambda row: row.at, reverse=True)
        return merged[index]


def clusters_with_state_counts():
    """Every cluster, with its node count and its nodes per state (one query)."""
    counts = {state: Count("nodes", filter=Q(nodes__state=state)) for state in NodeState.values}
    return Cluster.objects.annotate(node_count=Count("nodes"), **counts)
