"""Writes that change a node's facts. Each refreshes the node's state in its transaction."""

import hashlib
import secrets
from datetime import timedelta

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from clusterui.services import actor_name, record_audit
from healthchecks.choices import Severity
from healthchecks.models import HealthEvent
from healthchecks.services import do_close_health_event, do_record_health_event

from .inventory import (
    GPU_LOST,
    MISSING_FROM_HELLO,
    InventoryDifference,
    InventoryReview,
    gpu_list,
    hello_gpu,
    hello_problem,
    inventory_difference,
    inventory_gpu,
)
from .models import AgentCommand, AgentToken, Gpu, Node
from .script_models import NodeRole
from .scripts import announce_config_changed
from .states import refresh_node_state


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


@transaction.atomic
def do_record_hello(node, *, boot_id, agent_version="", gpus=(), slurm=None, now=None):
    """A hello from the node's agent: it is connected; a new boot_id means it rebooted.
    `slurm` is the hello's {"state", "reason"} (None: the node runs no Slurm).

    `gpus` is the hello's list of {index, uuid, name, pci_bus_id, memory_total_bytes}. It is
    kept on the node; new GPUs join the inventory, and a GPU of the inventory missing from
    it opens gpu_lost (nodes/inventory.py).
    """
    now = now or timezone.now()
    node = Node.objects.select_for_update().get(pk=node.pk)
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
    _note_missing_gpus(node, hello, boot_id=boot_id, now=now)
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


def _note_missing_gpus(node, hello, *, boot_id, now):
    """Inventory GPUs absent from the hello are marked missing and get a gpu_lost, unless
    one is open on them (a repeated hello is not a new loss). One present again loses the
    mark; its gpu_lost stays open, an edge signal (DESIGN.md)."""
    in_hello = {gpu["uuid"] for gpu in hello}
    inventory = list(node.gpus.in_inventory())
    missing = [gpu for gpu in inventory if gpu.uuid not in in_hello]
    Gpu.objects.filter(pk__in=[gpu.pk for gpu in inventory if gpu.uuid in in_hello],
                       missing_since__isnull=False).update(missing_since=None)
    Gpu.objects.filter(pk__in=[gpu.pk for gpu in missing if gpu.missing_since is None]).update(
        missing_since=now)
    lost_open = set(HealthEvent.objects.open().filter(signature=GPU_LOST, gpu__in=missing)
                    .values_list("gpu_id", flat=True))
    for gpu in missing:
        if gpu.pk in lost_open:
            continue
        do_record_health_event(
            node, signature=GPU_LOST, severity=Severity.CRITICAL, gpu=gpu,
            message=f"GPU {gpu.index} ({gpu.uuid}) is missing from the agent's hello",
            evidence={
                MISSING_FROM_HELLO: inventory_gpu(gpu),
                "hello_gpus": gpu_list(hello),
                "inventory_gpus": gpu_list(inventory),
                "boot_id": boot_id,
            },
            now=now,
        )


def review_gpu_inventory(node):
    """What accepting the node's latest hello as its inventory would change and close."""
    node = Node.objects.get(pk=node.pk)
    inventory = list(node.gpus.in_inventory())
    problem = hello_problem(node.hello_gpus)
    difference = InventoryDifference() if problem else inventory_difference(
        inventory, node.hello_gpus)
    # Closed: gpu_lost on the GPUs that leave, and those this rule opened on GPUs present
    # again; a gpu_lost the agent saw on a GPU still listed waits for a reboot's check.
    gpu_lost = HealthEvent.objects.open().filter(signature=GPU_LOST, gpu__isnull=False).filter(
        Q(gpu__in=difference.missing) | Q(evidence__has_key=MISSING_FROM_HELLO))
    return InventoryReview(difference, tuple(gpu_lost.filter(node=node).select_related("gpu")),
                           problem)


@transaction.atomic
def do_accept_gpu_inventory(node, *, actor, request=None, now=None):
    """The node's inventory becomes the GPUs of its latest hello, and the gpu_lost events
    that settles close: an operator's decision, or a repair's verify step (actor None).
    Returns the InventoryReview it carried out; nothing changes unless it is acceptable."""
    now = now or timezone.now()
    node = Node.objects.select_for_update().select_related("cluster").get(pk=node.pk)
    review = review_gpu_inventory(node)
    if not review.acceptable:
        return review
    difference = review.difference
    Gpu.objects.filter(pk__in=[gpu.pk for gpu in difference.missing]).update(removed_at=now)
    # Indexes move one row at a time and two GPUs may swap theirs: the moving rows step out
    # of the way first (NVML indexes stay far below 1000).
    Gpu.objects.filter(pk__in=[gpu.pk for gpu, _ in difference.changed]).update(
        index=F("index") + 1000)
    for gpu, seen in difference.changed:
        Gpu.objects.filter(pk=gpu.pk).update(**seen)
    left = {gpu.uuid: gpu for gpu in node.gpus.filter(removed_at__isnull=False)}
    for seen in difference.waiting:
        if seen["uuid"] in left:
            Gpu.objects.filter(pk=left[seen["uuid"]].pk).update(**seen, removed_at=None)
        else:
            Gpu.objects.create(node=node, **seen)
    node.gpus.in_inventory().update(missing_since=None)
    for event in review.gpu_lost:
        do_close_health_event(event, reason=f"GPU inventory accepted by {actor_name(actor)}",
                              actor=actor, now=now)
    record_audit(actor, "node.accept_gpu_inventory", node, cluster=node.cluster,
                 changes={**difference.for_audit(),
                          "closed_events": [str(event.public_id) for event in review.gpu_lost]},
                 request=request, now=now)
    refresh_node_state(node, actor=actor, reason="GPU inventory accepted", now=now)
    return review


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
    (the path a script save takes). An unknown role raises ValueError."""
    if role not in NodeRole.values:
        raise ValueError(f"unknown node role {role!r}: one of {', '.join(NodeRole.values)}")
    before = Node.objects.select_for_update().values_list("role", flat=True).get(pk=node.pk)
    if before == role:
        node.role = role
        return False
    Node.objects.filter(pk=node.pk).update(role=role)
    node.role = role
    record_audit(actor, "node.set_role", node, changes={"role": {"before": before, "after": role}},
                 cluster=node.cluster, request=request, now=now)
    announce_config_changed([node.pk])
    return True


# Agent tokens (PROTOCOL.md "Connecting"): random, shown once, stored as a SHA-256 hash.
JOIN_TOKEN_PREFIX = "cuj_"
NODE_TOKEN_PREFIX = "cun_"


def hash_token(plaintext):
    return hashlib.sha256(plaintext.encode()).hexdigest()


def _new_token(kind, cluster, *, node=None, actor=None, expires_at=None, note=""):
    prefix = JOIN_TOKEN_PREFIX if kind == AgentToken.Kind.JOIN else NODE_TOKEN_PREFIX
    plaintext = prefix + secrets.token_urlsafe(32)
    token = AgentToken.objects.create(
        kind=kind, cluster=cluster, node=node, token_hash=hash_token(plaintext),
        prefix=plaintext[:12], created_by=actor, expires_at=expires_at, note=note,
    )
    return token, plaintext


@transaction.atomic
def do_issue_join_token(cluster, *, actor=None, expires_at=None, note="", request=None):
    """A new join token for the cluster. Returns (token, plaintext); the plaintext is shown once."""
    token, plaintext = _new_token(
        AgentToken.Kind.JOIN, cluster, actor=actor, expires_at=expires_at, note=note
    )
    record_audit(actor, "jointoken.create", token, cluster=cluster, request=request,
                 changes={"expires_at": expires_at.isoformat() if expires_at else None,
                          "note": note})
    return token, plaintext


@transaction.atomic
def do_revoke_agent_token(token, *, actor=None, request=None, now=None):
    revoked = AgentToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
        revoked_at=now or timezone.now()
    )
    if revoked:
        record_audit(actor, f"{token.kind}token.revoke", token, cluster=token.cluster,
                     request=request)
    return bool(revoked)


@transaction.atomic
def do_issue_node_token(node, *, now=None):
    """A fresh node token; the node's earlier tokens stop working (a re-joined node)."""
    AgentToken.objects.filter(node=node, revoked_at__isnull=True).update(
        revoked_at=now or timezone.now()
    )
    _, plaintext = _new_token(AgentToken.Kind.NODE, node.cluster, node=node)
    return plaintext


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


# Commands to a node's agent (PROTOCOL.md `command` / `command_result`).
#
# A command goes out when asked if the node's agent is connected, else after its next hello.
# After a reconnect, only commands that never got an answer (queued, sent) go out again: the
# agent answers an id it has seen with its earlier answer and does not act twice. An accepted
# command is not sent again: the agent has started it.
#
# A reboot is done when the node says hello with another boot id than the one it had when
# the reboot was asked: ok, "the node rebooted", whatever the agent said or did not say
# (a rebooting agent is stopped before it could). This holds for a reboot still queued or
# sent, too: a node that rebooted meanwhile is not rebooted again.
#
# Commands go out only before their deadline; past it, expire_commands() times them out.


def command_frame(command):
    return {"type": "command", "id": command.pk, "action": command.action,
            "params": command.params}


def offer_command_to_agent(command_id, node_id):
    """Tell the node's agent connection, wherever it is served, that a command waits for it.
    Nothing listens while the agent is offline: its next hello picks the command up."""
    from clusterui.realtime import broadcast

    from .consumers import agent_group

    broadcast(agent_group(node_id), "command.send", command_id=command_id)


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
    node = Node.objects.select_for_update().select_related("cluster").get(pk=node.pk)
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
    transaction.on_commit(lambda: offer_command_to_agent(command.pk, node.pk))
    return command


def do_mark_command_sent(node_id, command_id, now=None):
    """The command's frame, marked as handed to the agent's connection; None when it is
    answered or finished, past its deadline, or not this node's."""
    now = now or timezone.now()
    sendable = AgentCommand.objects.filter(
        pk=command_id, node_id=node_id, status__in=AgentCommand.UNANSWERED, deadline_at__gt=now)
    if not sendable.update(status=AgentCommand.Status.SENT, sent_at=now):
        return None
    return command_frame(AgentCommand.objects.get(pk=command_id))


def unfinished_command_ids(node_id):
    """The node's commands that go out (again) after a hello: those never answered."""
    return list(AgentCommand.objects.filter(node_id=node_id, status__in=AgentCommand.UNANSWERED)
                .order_by("id").values_list("id", flat=True))


def _rebooted_since(command, node):
    # No boot id when asked: the node never said hello before, and nothing tells its boots apart.
    return (command.action == AgentCommand.Action.REBOOT and command.boot_id_before != ""
            and node.boot_id != command.boot_id_before)


def _finish(command, status, message, now):
    """Conditional: only an unfinished command finishes, once. True when this call did."""
    return bool(AgentCommand.objects.filter(pk=command.pk, status__in=AgentCommand.UNFINISHED)
                .update(status=status, message=message, finished_at=now))


def do_finish_reboots_after_hello(node_id, now=None):
    """The node's unfinished reboots, done if it has said hello with a new boot id since
    they were asked. Returns how many finished."""
    now = now or timezone.now()
    node = Node.objects.get(pk=node_id)
    finished = 0
    for command in AgentCommand.objects.unfinished().filter(node=node):
        if _rebooted_since(command, node):
            finished += _finish(command, AgentCommand.Status.OK, "the node rebooted", now)
    return finished


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
        _finish(command, status, message, now)
    command.refresh_from_db()
    return command


def expire_commands(now=None):
    """Commands past their deadline time out; a reboot whose node came back with a new boot
    id (a hello whose commands were not looked at) is done instead. Returns how many
    timed out."""
    now = now or timezone.now()
    expired = 0
    due = AgentCommand.objects.unfinished().filter(deadline_at__lte=now).select_related("node")
    for command in due:
        if _rebooted_since(command, command.node):
            _finish(command, AgentCommand.Status.OK, "the node rebooted", now)
        else:
            expired += _finish(command, AgentCommand.Status.TIMED_OUT, _why_late(command), now)
    return expired


def _why_late(command):
    if command.status == AgentCommand.Status.QUEUED:
        return "not sent in time: the node's agent was not connected"
    if command.status == AgentCommand.Status.SENT:
        return "no answer in time from the node's agent"
    if command.action == AgentCommand.Action.REBOOT:
        return "the node did not come back with a new boot id in time"
    return "accepted, but not finished in time"
