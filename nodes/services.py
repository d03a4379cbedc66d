"""Writes that change a node's facts. Each refreshes the node's state in its transaction."""

import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from clusterui.changes import Kind, record_change
from clusterui.models import Cluster
from clusterui.services import actor_name, record_audit

from . import agent_work
from .choices import NodeRole
from .inventory import hello_gpu
from .models import AgentCommand, AgentEventReceipt, AgentToken, Gpu, MaintenanceWindow, Node
from .states import note_on_timeline, refresh_node_state


@transaction.atomic
def do_register_node(cluster, name, *, hostname="", actor=None, now=None):
    now = now or timezone.now()
    node = Node(cluster=cluster, name=name, hostname=hostname or name, joined_at=now,
                acceptance_required=cluster.acceptance_tests_enabled)
    node.full_clean(exclude=["state"])
    node.save()
    refresh_node_state(node, actor=actor, reason="registered", now=now)
    node.refresh_from_db()
    return node


@transaction.atomic(savepoint=False)  # on every hello: no caller goes on after an error
def do_record_hello(node, *, boot_id, agent_version="", gpus=(), slurm=None, now=None):
    """A hello from the node's agent: it is connected; a new boot_id means it rebooted.
    `slurm` is the hello's {"state", "reason"} (None: the node runs no Slurm).

    `gpus` is the hello's list of {index, uuid, name, pci_bus_id, memory_total_bytes}. It is
    kept on the node; new GPUs join the inventory, and a GPU of the inventory missing from
    it opens gpu_lost (healthchecks.inventory.do_judge_inventory, which the caller runs
    after this).
    """
    now = now or timezone.now()
    node = Node.objects.select_for_update(no_key=True).get(pk=node.pk)
    rebooted = boot_id != node.boot_id
    hello = [hello_gpu(gpu) for gpu in gpus]
    Node.objects.filter(pk=node.pk).update(
        last_hello_at=now,
        last_seen=now,
        boot_id=boot_id,
        agent_version=agent_version,
        hello_gpus=hello,
        slurm_state=((slurm or {}).get("state") or "")[:64],
        **({"booted_at": now} if rebooted else {}),
    )
    _add_new_gpus(node, hello)
    if not rebooted:
        reason = "agent reconnected"
    else:
        reason = "rebooted (new boot id)" if node.boot_id else "first hello from the agent"
    refresh_node_state(node, reason=reason, now=now)
    node.refresh_from_db()
    return node


def _add_new_gpus(node, hello):
    """A hello's GPUs the inventory lacks join it at a free index (one that left it earlier
    rejoins with its row); one at an index another GPU holds (a replaced GPU) waits for a
    repair's verify step or an operator to accept it (do_accept_gpu_inventory)."""
    rows = list(node.gpus.all())
    in_inventory = {gpu.uuid for gpu in rows if gpu.removed_at is None}
    taken = {gpu.index for gpu in rows if gpu.removed_at is None}
    left = {gpu.uuid: gpu for gpu in rows if gpu.removed_at is not None}
    joining = []
    for gpu in hello:
        if gpu["uuid"] in in_inventory or gpu["index"] in taken:
            continue
        in_inventory.add(gpu["uuid"])
        taken.add(gpu["index"])
        if gpu["uuid"] in left:
            Gpu.objects.filter(pk=left[gpu["uuid"]].pk).update(
                **gpu, removed_at=None, missing_since=None)
        else:
            joining.append(Gpu(node=node, **gpu))
    Gpu.objects.bulk_create(joining)


@transaction.atomic
def do_pause_node(node, *, actor, reason, request=None, now=None):
    now = now or timezone.now()
    # A person's pause says who; the system's (a repair) says why on its own.
    text = f"paused by {actor.get_username()}: {reason}" if actor is not None else reason
    updated = Node.objects.filter(pk=node.pk, paused=False).update(
        paused=True, paused_reason=text[:255]
    )
    if updated:
        record_audit(actor, "node.pause", node, changes={"reason": reason},
                     cluster=node.cluster, request=request, now=now)
        refresh_node_state(node, actor=actor, now=now)
    node.refresh_from_db()
    return bool(updated)


@transaction.atomic
def do_resume_node(node, *, actor, request=None, now=None):
    now = now or timezone.now()
    updated = Node.objects.filter(pk=node.pk, paused=True).update(paused=False, paused_reason="")
    if updated:
        record_audit(actor, "node.resume", node, cluster=node.cluster, request=request, now=now)
        refresh_node_state(node, actor=actor, reason=f"resumed by {actor.get_username()}", now=now)
    node.refresh_from_db()
    return bool(updated)


@transaction.atomic
def do_set_node_role(node, role, *, actor, request=None, now=None):
    """Make the node a worker, login or controller node: the role picks its startup scripts.
    Returns True when the role changed: then it is audited (before and after) and, once
    committed, the node's agent, if connected, gets its config with the new role's scripts
    (an AGENT_CONFIG change, as a script save makes). An unknown role raises ValueError."""
    if role not in NodeRole.values:
        raise ValueError(f"unknown node role {role!r}: one of {', '.join(NodeRole.values)}")
    before = (Node.objects.select_for_update(no_key=True).values_list("role", flat=True)
              .get(pk=node.pk))
    if before == role:
        node.role = role
        return False
    Node.objects.filter(pk=node.pk).update(role=role)
    node.role = role
    record_audit(actor, "node.set_role", node, changes={"role": {"before": before, "after": role}},
                 cluster=node.cluster, request=request, now=now)
    record_change(Kind.AGENT_CONFIG, cluster_id=node.cluster_id, node_id=node.pk, now=now)
    return True


# Several nodes at once (the Nodes list's bulk form): all in one transaction; each returns
# one boolean per node, whether it changed.


@transaction.atomic
def do_bulk_pause_nodes(nodes, *, actor, reason, request=None):
    return [do_pause_node(node, actor=actor, reason=reason, request=request) for node in nodes]


@transaction.atomic
def do_bulk_resume_nodes(nodes, *, actor, request=None):
    return [do_resume_node(node, actor=actor, request=request) for node in nodes]


@transaction.atomic
def do_bulk_set_node_role(nodes, role, *, actor, request=None):
    return [do_set_node_role(node, role, actor=actor, request=request) for node in nodes]


# Agent tokens (PROTOCOL.md "Connecting"): random, shown once, stored as a SHA-256 hash.
JOIN_TOKEN_PREFIX = "cuj_"
NODE_TOKEN_PREFIX = "cun_"


def hash_token(plaintext):
    return hashlib.sha256(plaintext.encode()).hexdigest()


def _new_token(kind, cluster, **fields):
    prefix = JOIN_TOKEN_PREFIX if kind == AgentToken.Kind.JOIN else NODE_TOKEN_PREFIX
    plaintext = prefix + secrets.token_urlsafe(32)
    token = AgentToken.objects.create(kind=kind, cluster=cluster, token_hash=hash_token(plaintext),
                                      prefix=plaintext[:12], **fields)
    return token, plaintext


@transaction.atomic
def do_issue_join_token(cluster, *, actor=None, expires_at=None, single_use=False,
                        for_node=None, note="", request=None, now=None):
    """A new join token for the cluster. Returns (token, plaintext); the plaintext is shown once.
    It expires after CLUSTERUI_JOIN_TOKEN_HOURS unless `expires_at` says otherwise; a
    single-use one stops at its first join; one `for_node` re-joins only that node."""
    now = now or timezone.now()
    expires_at = expires_at or now + timedelta(hours=settings.CLUSTERUI_JOIN_TOKEN_HOURS)
    token, plaintext = _new_token(
        AgentToken.Kind.JOIN, cluster, created_by=actor, expires_at=expires_at,
        single_use=single_use, for_node=for_node, note=note)
    record_audit(actor, "jointoken.create", token, cluster=cluster, request=request, now=now,
                 changes={"expires_at": expires_at.isoformat(), "single_use": single_use,
                          "for_node": for_node.name if for_node else None, "note": note})
    return token, plaintext


@transaction.atomic
def do_revoke_agent_token(token, *, actor=None, request=None, now=None):
    """Revoke a token; a live connection that uses it is closed (4401) through the change
    feed."""
    revoked = AgentToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
        revoked_at=now or timezone.now()
    )
    if revoked:
        record_audit(actor, f"{token.kind}token.revoke", token, cluster=token.cluster,
                     request=request)
        if token.node_id is not None:
            record_change(Kind.AGENT_ACCESS, cluster_id=token.cluster_id, node_id=token.node_id,
                          object_id=token.pk, now=now)
    return bool(revoked)


@transaction.atomic
def do_issue_node_token(node, *, now=None):
    """A fresh node token; the node's earlier tokens stop working (a re-joined node).
    Returns (token, plaintext)."""
    AgentToken.objects.filter(node=node, revoked_at__isnull=True).update(
        revoked_at=now or timezone.now()
    )
    return _new_token(AgentToken.Kind.NODE, node.cluster, node=node)


def use_join_token(token, *, now):
    """A join token is about to register or re-join a node: a single-use one is spent now.
    False when another hello spent it first (the caller refuses this one)."""
    if not token.single_use:
        return True
    return AgentToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
        revoked_at=now) == 1


# Re-join (PROTOCOL.md): a join-token hello naming an existing node re-registers it only
# while the node, or its whole cluster, is open to re-join.
REJOIN_MAX_HOURS = 72
REPAIR_OPENER = "repair #{}"  # rejoin_opened_by of a repair's opening, which lasts until it ends


def opened_by_a_repair(node):
    return node.rejoin_opened_by.startswith(REPAIR_OPENER.format(""))


def rejoin_opening(node, now):
    """Why the node is open to re-join now ("opened by alice until 14:05 UTC"), or None."""
    for opened in (node, node.cluster):
        if opened.rejoin_open_until is not None and opened.rejoin_open_until > now:
            what = "" if opened is node else "the whole cluster "
            return (f"{what}opened by {opened.rejoin_opened_by} until "
                    f"{opened.rejoin_open_until:%Y-%m-%d %H:%M} UTC")
    return None


@transaction.atomic
def do_open_rejoin(node, *, by, until, actor=None, request=None, now=None):
    """Open the node to re-join until `until`; `by` says who (a user name, "repair #12")."""
    now = now or timezone.now()
    Node.objects.filter(pk=node.pk).update(rejoin_open_until=until, rejoin_opened_by=by)
    node.rejoin_open_until, node.rejoin_opened_by = until, by
    note_on_timeline(node, f"open to re-join until {until:%Y-%m-%d %H:%M} UTC ({by})",
                     actor=actor, now=now)
    record_audit(actor, "node.rejoin_open", node, cluster=node.cluster, request=request, now=now,
                 changes={"until": until.isoformat(), "by": by})


@transaction.atomic
def do_close_rejoin(node, *, actor=None, opened_by=None, reason, request=None, now=None):
    """Close the node to re-join (only when `opened_by` opened it, if given). True if it was
    open."""
    now = now or timezone.now()
    opened = Node.objects.filter(pk=node.pk, rejoin_open_until__isnull=False)
    if opened_by is not None:
        opened = opened.filter(rejoin_opened_by=opened_by)
    if not opened.update(rejoin_open_until=None, rejoin_opened_by=""):
        return False
    node.rejoin_open_until, node.rejoin_opened_by = None, ""
    note_on_timeline(node, f"closed to re-join: {reason}", actor=actor, now=now)
    record_audit(actor, "node.rejoin_close", node, cluster=node.cluster, request=request, now=now,
                 changes={"reason": reason})
    return True


@transaction.atomic
def do_open_cluster_rejoin(cluster, *, actor, until, request=None, now=None):
    """Open every node of the cluster to re-join until `until` (a migration)."""
    Cluster.objects.filter(pk=cluster.pk).update(
        rejoin_open_until=until, rejoin_opened_by=actor.get_username())
    record_audit(actor, "cluster.rejoin_open", cluster, cluster=cluster, request=request, now=now,
                 changes={"until": until.isoformat()})


@transaction.atomic
def do_close_cluster_rejoin(cluster, *, actor, request=None, now=None):
    if not Cluster.objects.filter(pk=cluster.pk, rejoin_open_until__isnull=False).update(
            rejoin_open_until=None, rejoin_opened_by=""):
        return False
    record_audit(actor, "cluster.rejoin_close", cluster, cluster=cluster, request=request, now=now)
    return True


@transaction.atomic
def do_remove_node(node, *, actor, reason, request=None, now=None):
    """Remove the node from the console: its tokens stop working, its live connection is
    closed (4401), and the node and its history go; the audit trail keeps the record. Refused
    (returns False) while a repair of the node is running: abort it first."""
    now = now or timezone.now()
    node = Node.objects.select_for_update().get(pk=node.pk)
    if node.running_repair:
        return False
    AgentToken.objects.filter(node=node, revoked_at__isnull=True).update(revoked_at=now)
    record_audit(actor, "node.remove", node, cluster=node.cluster, request=request, now=now,
                 changes={"reason": reason, "state": node.state, "boot_id": node.boot_id})
    record_change(Kind.AGENT_ACCESS, cluster_id=node.cluster_id, node_id=node.pk, now=now)
    node.delete()
    return True


def find_usable_token(plaintext, *, now=None):
    """The usable AgentToken matching `plaintext`, or None (unknown, expired or revoked)."""
    if not plaintext:
        return None
    now = now or timezone.now()
    return (
        AgentToken.objects.usable(now)
        .select_related("cluster", "node")
        .filter(token_hash=hash_token(plaintext))
        .first()
    )


# Commands to a node's agent (PROTOCOL.md `command` / `command_result`), one kind of agent
# work (nodes.agent_work: queued, sent, offered, expired).
#
# An accepted command is not sent again: the agent has started it.
#
# A reboot is done when the node says hello with another boot id than the one it had when
# the reboot was asked: ok, "the node rebooted", whatever the agent said or did not say
# (a rebooting agent is stopped before it could). This holds for a reboot still queued or
# sent, too: a node that rebooted meanwhile is not rebooted again.


def command_frame(command):
    return {"type": "command", "id": command.pk, "action": command.action,
            "params": command.params}


def _rebooted_since(command, node):
    # No boot id when asked: the node never said hello before, and nothing tells its boots apart.
    return (command.action == AgentCommand.Action.REBOOT and command.boot_id_before != ""
            and node.boot_id != command.boot_id_before)


def finish_reboots_after_hello(node_id, now=None):
    """The node's unfinished reboots, done if it has said hello with a new boot id since
    they were asked. Returns how many finished."""
    now = now or timezone.now()
    node = Node.objects.get(pk=node_id)
    finished = 0
    for command in AgentCommand.objects.unfinished().filter(node=node):
        if _rebooted_since(command, node):
            finished += agent_work.finish(COMMANDS, command, AgentCommand.Status.OK,
                                          "the node rebooted", now)
    return finished


def _done_at_deadline(command, now):
    """A reboot whose node came back with a new boot id (a hello whose commands were not
    looked at) is done, not timed out."""
    if not _rebooted_since(command, command.node):
        return False
    agent_work.finish(COMMANDS, command, AgentCommand.Status.OK, "the node rebooted", now)
    return True


def _why_late(command):
    if command.status == AgentCommand.Status.QUEUED:
        return "not sent in time: the node's agent was not connected"
    if command.status == AgentCommand.Status.SENT:
        return "no answer in time from the node's agent"
    if command.action == AgentCommand.Action.REBOOT:
        return "the node did not come back with a new boot id in time"
    return "accepted, but not finished in time"


COMMANDS = agent_work.WorkKind(
    name="command", model=AgentCommand, unanswered=AgentCommand.UNANSWERED,
    unfinished=AgentCommand.UNFINISHED, sent=AgentCommand.Status.SENT,
    timed_out=AgentCommand.Status.TIMED_OUT, frame=command_frame, why_late=_why_late,
    after_hello=finish_reboots_after_hello, done_otherwise=_done_at_deadline,
)


@transaction.atomic
def do_send_command(node, action, *, params=None, actor=None, deadline_s=None, request=None,
                    now=None):
    """Ask the node's agent to carry out `action` (AgentCommand.Action). While a command of
    the same action is unfinished on the node, that one is returned and no second one is
    made: a repeated request (a retried repair step, a double click) does not reboot twice.
    `actor` None: the system (a repair)."""
    if action not in AgentCommand.Action.values:
        raise ValueError(f"unknown command action {action!r}")
    now = now or timezone.now()
    node = Node.objects.select_for_update(no_key=True).get(pk=node.pk)
    unfinished = AgentCommand.objects.unfinished().filter(node=node, action=action).first()
    if unfinished is not None:
        return unfinished
    if deadline_s is None:
        deadline_s = AgentCommand.DEFAULT_DEADLINE_S[action]
    command = AgentCommand.objects.create(
        node=node, action=action, params=params or {}, requested_by=actor, requested_at=now,
        deadline_at=now + timedelta(seconds=deadline_s), boot_id_before=node.boot_id,
    )
    if actor is not None:
        record_audit(actor, "agentcommand.send", command, cluster=node.cluster, request=request,
                     changes={"node": node.name, "action": action, "params": command.params},
                     now=now)
    agent_work.queue_work(COMMANDS, command, now=now)
    return command


def do_record_command_result(node, *, command_id, status, message="", now=None):
    """An agent's command_result. Returns the command, or None when the node has no such
    command. `accepted` moves a command not yet answered to accepted; `ok` and `failed`
    finish an unfinished one. An answer to a finished command changes nothing (a late
    answer after its deadline, an `accepted` after the node came back rebooted)."""
    now = now or timezone.now()
    command = AgentCommand.objects.filter(pk=command_id, node=node).first()
    if command is None:
        return None
    if status == AgentCommand.Status.ACCEPTED:
        AgentCommand.objects.filter(pk=command.pk, status__in=AgentCommand.UNANSWERED).update(
            status=AgentCommand.Status.ACCEPTED, message=message)
    else:
        agent_work.finish(COMMANDS, command, status, message, now)
    command.refresh_from_db()
    return command


def prune_event_receipts(now=None):
    """Receipts of agent events older than CLUSTERUI_EVENT_RECEIPT_RETENTION_DAYS go (an
    event resent after that is stored again). Returns how many."""
    now = now or timezone.now()
    cutoff = now - timedelta(days=settings.CLUSTERUI_EVENT_RECEIPT_RETENTION_DAYS)
    deleted, _ = AgentEventReceipt.objects.filter(received_at__lt=cutoff).delete()
    return deleted


@transaction.atomic
def do_create_maintenance_window(cluster, *, reason, starts_at, ends_at=None, cron="",
                                 duration_minutes=None, nodes=(), actor, request=None, now=None):
    """A maintenance window over `nodes` of the cluster (none: the whole cluster)."""
    now = now or timezone.now()
    window = MaintenanceWindow.objects.create(
        cluster=cluster, whole_cluster=not nodes, reason=reason, starts_at=starts_at, ends_at=ends_at, cron=cron,
        duration_minutes=duration_minutes, created_at=now, created_by_name=actor_name(actor))
    window.nodes.set(nodes)
    record_audit(actor, "maintenance.create", window, cluster=cluster, request=request, now=now,
                 changes=_window_fields(window))
    return window


@transaction.atomic
def do_update_maintenance_window(window, *, reason, ends_at, actor, request=None, now=None):
    """Change a window's reason or its end. Returns the fields changed."""
    now = now or timezone.now()
    window = MaintenanceWindow.objects.select_for_update().get(pk=window.pk)
    changes = {field: {"before": _when(getattr(window, field)), "after": _when(value)}
               for field, value in (("reason", reason), ("ends_at", ends_at))
               if getattr(window, field) != value}
    if changes:
        window.reason, window.ends_at = reason, ends_at
        window.save(update_fields=["reason", "ends_at"])
        record_audit(actor, "maintenance.update", window, cluster=window.cluster,
                     request=request, now=now, changes=changes)
    return list(changes)


@transaction.atomic
def do_end_maintenance_window(window, *, actor, request=None, now=None):
    """End a window now (its current occurrence and any to come)."""
    now = now or timezone.now()
    ended = MaintenanceWindow.objects.filter(pk=window.pk, ended_at__isnull=True).update(
        ended_at=now, ended_by_name=actor_name(actor))
    if ended:
        record_audit(actor, "maintenance.end", window, cluster=window.cluster, request=request,
                     now=now, changes={"reason": window.reason})
    return bool(ended)


def _when(value):
    return value.isoformat() if hasattr(value, "isoformat") else value


def _window_fields(window):
    return {"reason": window.reason, "starts_at": _when(window.starts_at),
            "ends_at": _when(window.ends_at), "cron": window.cron,
            "duration_minutes": window.duration_minutes,
            "nodes": "the whole cluster" if window.whole_cluster
            else sorted(node.name for node in window.nodes.all())}
