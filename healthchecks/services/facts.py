"""A node's health facts (its open problems, where its acceptance battery stands), handed
down to the node with refresh_node_states in the transaction that changed them."""


from django.db import connection
from django.utils import timezone

from common.bulk_sql import column, one_of, select, table
from nodes.models import Gpu, Node
from nodes.states import refresh_node_states

from ..check_catalog import acceptance_battery
from ..choices import NODE_AFFECTING
from ..models import CheckRun, HealthEvent, Silence


def open_problem_events(node, now):
    """The node's open warning/critical events, less signatures an operator silenced,
    critical before warning, then oldest first."""
    return open_problem_events_of([node.pk], now)[node.pk]


def open_problem_events_of(node_ids, now):
    """open_problem_events() of many nodes in two queries: {node_id: [event, ...]}."""
    rows = _open_problem_rows(node_ids, now)
    found = HealthEvent.objects.select_related("gpu").in_bulk([row[0] for row in rows])
    events = {node_id: [] for node_id in node_ids}
    for event_id, node_id, _, _ in rows:
        events[node_id].append(found[event_id])
    return events


def describe_open_problems(problems):
    """'xid:79 on GPU 3 (+1 more)' for a node's open problems, [(signature, GPU index or
    None)], worst first."""
    if not problems:
        return ""
    signature, gpu_index = problems[0]
    text = signature
    if gpu_index is not None:
        text += f" on GPU {gpu_index}"
    if len(problems) > 1:
        text += f" (+{len(problems) - 1} more)"
    return text


def open_problems_described(node_ids, now):
    """describe_open_problems() of each node, from one read of signatures and GPU indexes."""
    problems = {node_id: [] for node_id in node_ids}
    for _, node_id, signature, gpu_index in _open_problem_rows(node_ids, now):
        problems[node_id].append((signature, gpu_index))
    return {node_id: describe_open_problems(found) for node_id, found in problems.items()}


def _open_problem_rows(node_ids, now):
    """(event id, node id, signature, GPU index) of the nodes' open warning/critical events,
    less signatures an operator silenced, critical before warning, then oldest first. SQL:
    it runs for every batch of agent events."""
    node_ids = list(node_ids)
    if not node_ids:
        return []
    event, gpu, silence = (table(model) for model in (HealthEvent, Gpu, Silence))
    e = {name: f"e.{column(HealthEvent, name)}" for name in (
        "id", "node", "gpu", "signature", "severity", "first_seen", "closed_at")}
    s = {name: f"s.{column(Silence, name)}" for name in ("node", "signature", "until")}
    nodes, node_params = one_of(HealthEvent, "node", node_ids, alias="e")
    affecting = ", ".join(["%s"] * len(NODE_AFFECTING))
    until = Silence._meta.get_field("until").get_db_prep_value(now, connection)
    return select(
        f"SELECT {e['id']}, {e['node']}, {e['signature']}, g.{column(Gpu, 'index')} "
        f"FROM {event} e LEFT JOIN {gpu} g ON g.{column(Gpu, 'id')} = {e['gpu']} "
        f"WHERE {e['closed_at']} IS NULL AND {nodes} AND {e['severity']} IN ({affecting}) "
        f"AND NOT EXISTS (SELECT 1 FROM {silence} s WHERE {s['node']} = {e['node']} "
        f"AND {s['signature']} = {e['signature']} AND {s['until']} > %s) "
        # "critical" sorts before "warning".
        f"ORDER BY {e['severity']}, {e['first_seen']}, {e['id']}",
        [*node_params, *NODE_AFFECTING, until])


def acceptance_detail(node):
    """Where a node's acceptance battery stands: running, or which checks did not pass."""
    battery = acceptance_battery(node.cluster)
    latest = latest_runs(node, CheckRun.Purpose.ACCEPTANCE, battery, node.joined_at)
    if not latest:
        return "acceptance tests have not started"
    if any(run.status in CheckRun.UNFINISHED for run in latest.values()):
        return "running acceptance tests"
    failed = [f"{name} {latest[name].get_status_display()}" for name in battery
              if name in latest and latest[name].status != CheckRun.Status.PASSED]
    return "acceptance tests did not pass: " + ", ".join(failed) if failed else ""


def health_facts_of(node_ids, now):
    """The facts this app owns (nodes.states.HANDED_DOWN) of each node: {node_id: facts}.
    SQL for the reads every batch of agent events makes."""
    node_ids = list(node_ids)
    if not node_ids:
        return {}
    where, params = one_of(Node, "id", node_ids)
    nodes = select(f"SELECT {column(Node, 'id')}, {column(Node, 'acceptance_required')}, "
                   f"{column(Node, 'boot_id')} FROM {table(Node)} WHERE {where}", params)
    accepting = {node.pk: node for node in Node.objects.filter(
        pk__in=[node_id for node_id, required, _ in nodes if required])}
    problems = open_problems_described([node_id for node_id, _, _ in nodes], now)
    where, params = one_of(CheckRun, "node", node_ids)
    unfinished = ", ".join(["%s"] * len(CheckRun.UNFINISHED))
    checks_running = set(select(
        f"SELECT {column(CheckRun, 'node')}, {column(CheckRun, 'boot_id')} "
        f"FROM {table(CheckRun)} WHERE {where} AND {column(CheckRun, 'purpose')} = %s "
        f"AND {column(CheckRun, 'status')} IN ({unfinished})",
        [*params, CheckRun.Purpose.AFTER_REBOOT, *CheckRun.UNFINISHED]))
    return {
        node_id: {
            "open_problem": problems[node_id],
            "acceptance_detail": (acceptance_detail(accepting[node_id]) if node_id in accepting
                                  else ""),
            "checks_running_for_boot": boot_id if (node_id, boot_id) in checks_running else "",
        }
        for node_id, _, boot_id in nodes
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
