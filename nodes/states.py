"""Node states: the one function that decides a node's state, and the one that writes it.

DESIGN.md's precedence table, first that holds wins:

    paused     an operator paused the node, or a repair is running on it
    pending    never connected, or acceptance tests are on and have not passed since it joined
    booting    a hello with a new boot_id came less than the boot window ago,
               or boot startup scripts / post-repair checks are still running
    unhealthy  an open warning/critical health event (a lost heartbeat is one)
    healthy    none of the above

Services change facts and call refresh_node_state() in the same transaction; nothing
else assigns Node.state.
"""

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from clusterui.services import actor_name

from .choices import NodeState
from .models import Node, NodeTransition

@dataclass(frozen=True)
class NodeFacts:
    paused: bool = False
    paused_reason: str = ""
    running_repair: str = ""
    ever_connected: bool = False
    acceptance_pending: bool = False
    acceptance_detail: str = ""
    boot_window_open: bool = False
    boot_tasks_running: bool = False
    worst_open_problem: str = ""


def compute_state(facts):
    """(state, reason) for a node with these facts. Pure: no database, no clock."""
    if facts.paused:
        return NodeState.PAUSED, facts.paused_reason or "paused by an operator"
    if facts.running_repair:
        return NodeState.PAUSED, facts.running_repair
    if not facts.ever_connected:
        return NodeState.PENDING, "agent has never connected"
    if facts.acceptance_pending:
        return NodeState.PENDING, facts.acceptance_detail or "acceptance tests have not passed yet"
    if facts.boot_window_open:
        return NodeState.BOOTING, "rebooted (new boot id)"
    if facts.boot_tasks_running:
        return NodeState.BOOTING, "boot scripts or post-repair checks running"
    if facts.worst_open_problem:
        return NodeState.UNHEALTHY, facts.worst_open_problem
    return NodeState.HEALTHY, ""


def boot_window():
    return timedelta(seconds=settings.CLUSTERUI_BOOT_WINDOW_S)


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


def open_problem_events(node, now):
    """The node's open warning/critical events, less signatures an operator silenced."""
    from healthchecks.choices import NODE_AFFECTING
    from healthchecks.models import HealthEvent, Silence

    silenced = Silence.objects.active(now).filter(node=node).values("signature")
    # Critical before warning ("critical" sorts before "warning"), then oldest first.
    return list(
        HealthEvent.objects.open()
        .filter(node=node, severity__in=NODE_AFFECTING)
        .exclude(signature__in=silenced)
        .select_related("gpu")
        .order_by("severity", "first_seen", "id")
    )


def acceptance_detail(node):
    """Where a node's acceptance battery stands: running, or which checks did not pass."""
    from healthchecks.checks import ACCEPTANCE_CHECKS
    from healthchecks.models import CheckRun

    runs = CheckRun.objects.filter(
        node=node, purpose=CheckRun.Purpose.ACCEPTANCE, requested_at__gte=node.joined_at
    ).order_by("requested_at", "id")
    latest = {run.check_name: run for run in runs}
    if not latest:
        return "acceptance tests have not started"
    if any(run.status in CheckRun.UNFINISHED for run in latest.values()):
        return "running acceptance tests"
    failed = [f"{name} {latest[name].get_status_display()}" for name in ACCEPTANCE_CHECKS
              if name in latest and latest[name].status != CheckRun.Status.PASSED]
    return "acceptance tests did not pass: " + ", ".join(failed) if failed else ""


def checks_after_reboot_running(node):
    from healthchecks.models import CheckRun

    return CheckRun.objects.unfinished().filter(
        node=node, purpose=CheckRun.Purpose.AFTER_REBOOT, boot_id=node.boot_id
    ).exists()


def running_repair(node):
    """'repair #12 (reboot) is running', or "" when no repair runs on the node."""
    from repairs.models import Repair

    repair = Repair.objects.filter(node=node, status="running").only("pk", "action").first()
    return f"repair #{repair.pk} ({repair.action}) is running" if repair is not None else ""


def facts_for(node, now):
    acceptance_pending = node.acceptance_required and (
        node.acceptance_passed_at is None or node.acceptance_passed_at < node.joined_at
    )
    return NodeFacts(
        paused=node.paused,
        paused_reason=node.paused_reason,
        running_repair=running_repair(node),
        ever_connected=node.last_hello_at is not None,
        acceptance_pending=acceptance_pending,
        acceptance_detail=acceptance_detail(node) if acceptance_pending else "",
        boot_window_open=node.booted_at is not None and now - node.booted_at < boot_window(),
        boot_tasks_running=node.boot_tasks_running or checks_after_reboot_running(node),
        worst_open_problem=describe_open_problems(open_problem_events(node, now)),
    )


def refresh_node_state(node, *, actor=None, reason="", now=None):
    """Recompute the node's state from its facts; on a change, write it with its transition.

    Call inside the transaction that changed the facts. Returns True when the state changed.
    """
    now = now or timezone.now()
    with transaction.atomic():
        node = Node.objects.select_for_update().select_related("cluster").get(pk=node.pk)
        state, state_reason = compute_state(facts_for(node, now))
        if state == node.state and state_reason == node.state_reason:
            return False
        if state == node.state:
            Node.objects.filter(pk=node.pk).update(state_reason=state_reason)
            return False
        Node.objects.filter(pk=node.pk).update(
            state=state, state_reason=state_reason, state_changed_at=now
        )
        NodeTransition.objects.create(
            cluster_id=node.cluster_id,
            node=node,
            from_state=node.state,
            to_state=state,
            reason=(reason or state_reason)[:255],
            actor=actor,
            actor_name=actor_name(actor),
            at=now,
        )
        return True


def refresh_due_node_states(now=None):
    """Time-driven changes: nodes whose boot window has ended. Returns how many changed."""
    now = now or timezone.now()
    due = Node.objects.filter(
        state=NodeState.BOOTING, boot_tasks_running=False, booted_at__lte=now - boot_window()
    )
    from .scripts import do_end_overdue_boot_holds

    changed = do_end_overdue_boot_holds(now=now)
    return changed + sum(refresh_node_state(node, reason="boot window ended", now=now)
                         for node in due)


def note_on_timeline(node, reason, *, actor=None, now=None):
    """A timeline row for something that happened to a node without changing its state."""
    node = Node.objects.get(pk=node.pk)
    NodeTransition.objects.create(
        cluster_id=node.cluster_id, node=node, from_state=node.state, to_state=node.state,
        reason=reason[:255], actor=actor, actor_name=actor_name(actor), at=now or timezone.now(),
    )
