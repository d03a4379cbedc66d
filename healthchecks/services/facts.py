"""A node's health facts (its open problems, where its acceptance battery stands), handed
down to the node with refresh_node_states in the transaction that changed them."""


from django.db.models import Exists, OuterRef
from django.utils import timezone

from nodes.models import Node
from nodes.states import refresh_node_states

from ..check_catalog import ACCEPTANCE_CHECKS
from ..choices import NODE_AFFECTING
from ..models import CheckRun, HealthEvent, Silence


def open_problem_events(node, now):
    """The node's open warning/critical events, less signatures an operator silenced,
    critical before warning, then oldest first."""
    return open_problem_events_of([node.pk], now)[node.pk]


def open_problem_events_of(node_ids, now):
    """open_problem_events() of many nodes in one query: {node_id: [event, ...]}."""
    silenced = Silence.objects.active(now).filter(node=OuterRef("node"),
                                                  signature=OuterRef("signature"))
    events = {node_id: [] for node_id in node_ids}
    # "critical" sorts before "warning".
    for event in (HealthEvent.objects.open()
                  .filter(node_id__in=list(node_ids), severity__in=NODE_AFFECTING)
                  .exclude(Exists(silenced))
                  .select_related("gpu")
                  .order_by("severity", "first_seen", "id")):
        events[event.node_id].append(event)
    return events


def describe_open_problems(events):
    """'xid:79 on GPU 3 (+1 more)' for a node's open warning/critical events, worst first."""
    if not events:
        return ""
    worst = events[0]
    text = worst.signature
    if worst.gpu is not None:
        text += f" on GPU {worst.gpu.index}"
    if len(events) > 1:
        text += f" (+{len(events) - 1} more)"
    return text


def acceptance_detail(node):
    """Where a node's acceptance battery stands: running, or which checks did not pass."""
    latest = latest_runs(node, CheckRun.Purpose.ACCEPTANCE, ACCEPTANCE_CHECKS, node.joined_at)
    if not latest:
        return "acceptance tests have not started"
    if any(run.status in CheckRun.UNFINISHED for run in latest.values()):
        return "running acceptance tests"
    failed = [f"{name} {latest[name].get_status_display()}" for name in ACCEPTANCE_CHECKS
              if name in latest and latest[name].status != CheckRun.Status.PASSED]
    return "acceptance tests did not pass: " + ", ".join(failed) if failed else ""


def health_facts_of(node_ids, now):
    """The facts this app owns (nodes.states.HANDED_DOWN) of each node: {node_id: facts}."""
    nodes = Node.objects.only("acceptance_required", "joined_at", "boot_id").in_bulk(
        list(node_ids))
    problems = open_problem_events_of(nodes, now)
    checks_running = set(
        CheckRun.objects.unfinished()
        .filter(node_id__in=list(nodes), purpose=CheckRun.Purpose.AFTER_REBOOT)
        .values_list("node_id", "boot_id"))
    return {
        node.pk: {
            "open_problem": describe_open_problems(problems[node.pk]),
            "acceptance_detail": acceptance_detail(node) if node.acceptance_required else "",
            "checks_running_for_boot": (node.boot_id if (node.pk, node.boot_id) in checks_running
                                        else ""),
        }
        for node in nodes.values()
    }


def refresh_health_facts(node, *, actor=None, reason="", now=None):
    """Hand the node its health facts and recompute its state (nodes.states)."""
    return node.pk in refresh_health_facts_of({node.pk: reason}, actor=actor, now=now)


def refresh_health_facts_of(reasons, *, actor=None, now=None):
    """refresh_health_facts() of many nodes, {node_id: reason}, in a few queries. Returns the
    ids whose state changed."""
    now = now or timezone.now()
    return refresh_node_states(health_facts_of(reasons, now), actor=actor, reasons=reasons,
                               now=now)


def latest_runs(node, purpose, check_names, since):
    """{check name: its latest run of this purpose requested since `since`}."""
    runs = CheckRun.objects.filter(node=node, purpose=purpose, check_name__in=check_names,
                                   requested_at__gte=since).order_by("requested_at", "id")
    return {run.check_name: run for run in runs}
