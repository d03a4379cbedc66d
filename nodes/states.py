"""Node states: the one function that decides a node's state, and the one that writes it.

DESIGN.md's precedence table, first that holds wins:

    paused     an operator paused the node, or a repair is running on it
    pending    never connected, or acceptance tests are on and have not passed since it joined
    booting    a hello with a new boot_id came less than the boot window ago,
               or boot startup scripts / post-repair checks are still running
    unhealthy  an open warning/critical health event (a lost heartbeat is one)
    healthy    none of the above

Services change facts and call refresh_node_state() in the same transaction; nothing
else assigns Node.state. Facts that higher apps own (open health events, acceptance and
post-reboot checks, a running repair) are kept on the node as those apps hand them down:
refresh_node_state(node, open_problem=...) stores them and recomputes, so this module
imports none of those apps.
"""

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from clusters.change_feed import Kind, record_changes
from clusters.services import actor_name
from common.bulk_sql import update_rows

from .choices import OUT_OF_SERVICE, NodeState
from .cluster_status import (refresh_cluster_statuses,
                             refresh_cluster_statuses_after_commit)
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


def facts_for(node, now):
    acceptance_pending = node.acceptance_required and (
        node.acceptance_passed_at is None or node.acceptance_passed_at < node.joined_at
    )
    checks_running = bool(node.checks_running_for_boot) and (
        node.checks_running_for_boot == node.boot_id)
    return NodeFacts(
        paused=node.paused,
        paused_reason=node.paused_reason,
        running_repair=node.running_repair,
        ever_connected=node.last_hello_at is not None,
        acceptance_pending=acceptance_pending,
        acceptance_detail=node.acceptance_detail if acceptance_pending else "",
        boot_window_open=node.booted_at is not None and now - node.booted_at < boot_window(),
        boot_tasks_running=node.boot_tasks_running or checks_running,
        worst_open_problem=node.open_problem,
    )


HANDED_DOWN = ("open_problem", "acceptance_detail", "checks_running_for_boot", "running_repair")
# What refresh_node_states reads of a node: facts_for's fields and the state's own.
READ_FOR_STATE = (
    *HANDED_DOWN, "cluster", "state", "state_reason", "state_changed_at", "paused",
    "paused_reason", "last_hello_at", "acceptance_required", "acceptance_passed_at",
    "joined_at", "booted_at", "boot_id", "boot_tasks_running")


def refresh_node_state(node, *, actor=None, reason="", now=None, **facts):
    """Recompute the node's state from its facts; on a change, write it with its transition
    and a change row. `facts`: new values of the HANDED_DOWN facts, stored first.

    Call inside the transaction that changed the facts. Returns True when the state changed.
    """
    changed = refresh_node_states({node.pk: facts}, actor=actor, reasons={node.pk: reason},
                                  now=now)
    return node.pk in changed


def refresh_node_states(facts_of_node, *, actor=None, reasons=None, now=None):
    """refresh_node_state() for many nodes at once: {node_id: handed-down facts} and
    {node_id: reason}. Their rows are locked in one query, in id order (as every writer of
    many nodes takes them, so none waits on another in a cycle), and only their rows: their
    cluster's would make every refresh in a cluster queue. Returns the ids whose state
    changed."""
    for facts in facts_of_node.values():
        unknown = set(facts) - set(HANDED_DOWN)
        if unknown:
            raise TypeError(f"not a handed-down node fact: {', '.join(sorted(unknown))}")
    now = now or timezone.now()
    reasons = reasons or {}
    changed, transitions, updated, fields = [], [], [], set()
    # No savepoint: it runs on every hello and event batch, and no caller goes on after an
    # error inside.
    with transaction.atomic(savepoint=False):
        nodes = (Node.objects.filter(pk__in=list(facts_of_node)).order_by("pk")
                 .only(*READ_FOR_STATE).select_for_update(no_key=True))
        for node in nodes:
            updates = {name: value[:255] for name, value in facts_of_node[node.pk].items()
                       if getattr(node, name) != value[:255]}
            for name, value in updates.items():
                setattr(node, name, value)
            state, state_reason = compute_state(facts_for(node, now))
            if state != node.state:
                reason = reasons.get(node.pk) or state_reason
                transitions.append(NodeTransition(
                    cluster_id=node.cluster_id, node=node, from_state=node.state, to_state=state,
                    reason=reason[:255], actor=actor, actor_name=actor_name(actor), at=now))
                changed.append(node)
                updates.update(state=state, state_changed_at=now)
                node.state, node.state_changed_at = state, now
            if state_reason != node.state_reason:
                updates["state_reason"] = node.state_reason = state_reason
            if updates:
                updated.append(node)
                fields.update(updates)
        # One update for them all: each row gets its own values (the rows are locked).
        fields = sorted(fields)
        update_rows(Node, fields, [(node.pk, *(getattr(node, name) for name in fields))
                                   for node in updated])
        NodeTransition.objects.bulk_create(transitions, batch_size=500)
        record_changes(Kind.NODE_STATE, [(node.cluster_id, node.pk, "") for node in changed],
                       now=now)
        if changed:
            refresh_cluster_statuses_after_commit({node.cluster_id for node in changed},
                                                  actor=actor, now=now)
    return {node.pk for node in changed}


def refresh_due_node_states(now=None):
    """Time-driven changes: nodes whose boot window has ended, and clusters whose
    maintenance window started or ended. Returns how many nodes changed."""
    now = now or timezone.now()
    due = Node.objects.filter(
        state=NodeState.BOOTING, boot_tasks_running=False, booted_at__lte=now - boot_window()
    )
    changed = sum(refresh_node_state(node, reason="boot window ended", now=now) for node in due)
    refresh_cluster_statuses(now=now)
    return changed


def note_on_timeline(node, reason, *, actor=None, now=None):
    """A timeline row for something that happened to a node without changing its state."""
    node = Node.objects.get(pk=node.pk)
    NodeTransition.objects.create(
        cluster_id=node.cluster_id, node=node, from_state=node.state, to_state=node.state,
        reason=reason[:255], actor=actor, actor_name=actor_name(actor), at=now or timezone.now(),
    )


def out_of_service(cluster):
    """(how many of the cluster's nodes are out of service, how many nodes it has)."""
    counts = Node.objects.filter(cluster=cluster).aggregate(
        out=Count("pk", filter=Q(state__in=OUT_OF_SERVICE)), total=Count("pk"))
    return counts["out"], counts["total"]
