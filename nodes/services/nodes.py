"""Registering a node, its hellos, pausing and resuming it, its role, removing it."""

from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone

from clusters.change_feed import Kind, record_change
from clusters.models import Cluster
from clusters.services import record_audit

from ..choices import NodeRole
from ..cluster_status import (refresh_cluster_statuses,
                              refresh_cluster_statuses_after_commit)
from ..inventory import hello_digest, hello_gpu
from ..models import AgentEventReceipt, AgentToken, Gpu, Node
from ..states import refresh_node_state


@transaction.atomic
def do_register_node(cluster: Cluster, name: str, *, hostname="",
                     actor: AbstractBaseUser | None = None, now: datetime | None = None) -> Node:
    now = now or timezone.now()
    node = Node(cluster=cluster, name=name, hostname=hostname or name, joined_at=now,
                acceptance_required=cluster.acceptance_tests_enabled)
    # The name's own checks; not the two reads for the cluster and the name's uniqueness:
    # the cluster is at hand, and the joins that call this looked the name up already
    # (the database's constraint refuses the loser of a race).
    node.full_clean(exclude=["state", "cluster"], validate_unique=False,
                    validate_constraints=False)
    node.save()
    refresh_node_state(node, actor=actor, reason="registered", now=now)
    node.refresh_from_db()
    return node


@transaction.atomic(savepoint=False)  # on every hello: no caller goes on after an error
def do_record_hello(node: Node, *, boot_id, agent_version="", gpus=(), slurm=None,
                    now: datetime | None = None) -> Node:
    """A hello from the node's agent: it is connected; a new boot_id means it rebooted.
    `slurm` is the hello's {"state", "reason"} (None: the node runs no Slurm).

    `gpus` is the hello's list of {index, uuid, name, serial, pci_bus_id,
    memory_total_bytes}. It is kept on the node; new GPUs join the inventory, and a GPU of
    the inventory missing from it opens gpu_lost (healthchecks.gpu_lost.do_judge_inventory,
    which the caller runs after this). A GPU's serial is recorded as the hello says it: a
    board's serial is a fact of the board, not an inventory change to accept.
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
        hello_digest=hello_digest(agent_version=agent_version, gpus=gpus, slurm=slurm),
        **({"booted_at": now} if rebooted else {}),
    )
    _add_new_gpus(node, hello, {gpu["uuid"]: gpu.get("serial") or "" for gpu in gpus})
    if not rebooted:
        reason = "agent reconnected"
    else:
        reason = "rebooted (new boot id)" if node.boot_id else "first hello from the agent"
    changed = refresh_node_state(node, reason=reason, now=now)
    if node.last_hello_at is None and not changed:
        # Its first hello joins it to the cluster, though a node awaiting acceptance stays
        # pending: the cluster is then accepting, no longer provisioning.
        refresh_cluster_statuses_after_commit([node.cluster_id], now=now)
    node.refresh_from_db()
    return node


def _add_new_gpus(node, hello, serials):
    """A hello's GPUs the inventory lacks join it at a free index (one that left it earlier
    rejoins with its row); one at an index another GPU holds (a replaced GPU) waits for a
    repair's verify step or an operator to accept it (do_accept_gpu_inventory). serials:
    {uuid: board serial, "" where none was read}, kept on each known row."""
    rows = list(node.gpus.all())
    for gpu in rows:
        serial = serials.get(gpu.uuid, "")
        if serial and serial != gpu.serial:
            Gpu.objects.filter(pk=gpu.pk).update(serial=serial)
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
            joining.append(Gpu(node=node, serial=serials.get(gpu["uuid"], ""), **gpu))
    Gpu.objects.bulk_create(joining)


@transaction.atomic
def do_pause_node(node: Node, *, actor: AbstractBaseUser | None, reason,
                  request: HttpRequest | None = None, now: datetime | None = None) -> bool:
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
def do_resume_node(node: Node, *, actor: AbstractBaseUser, request: HttpRequest | None = None,
                   now: datetime | None = None) -> bool:
    now = now or timezone.now()
    updated = Node.objects.filter(pk=node.pk, paused=True).update(paused=False, paused_reason="")
    if updated:
        record_audit(actor, "node.resume", node, cluster=node.cluster, request=request, now=now)
        refresh_node_state(node, actor=actor, reason=f"resumed by {actor.get_username()}", now=now)
    node.refresh_from_db()
    return bool(updated)


@transaction.atomic
def do_set_node_role(node: Node, role, *, actor: AbstractBaseUser,
                     request: HttpRequest | None = None, now: datetime | None = None) -> bool:
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
def do_bulk_pause_nodes(nodes, *, actor: AbstractBaseUser | None, reason,
                        request: HttpRequest | None = None) -> list[bool]:
    return [do_pause_node(node, actor=actor, reason=reason, request=request) for node in nodes]


@transaction.atomic
def do_bulk_resume_nodes(nodes, *, actor: AbstractBaseUser,
                         request: HttpRequest | None = None) -> list[bool]:
    return [do_resume_node(node, actor=actor, request=request) for node in nodes]


@transaction.atomic
def do_bulk_set_node_role(nodes, role, *, actor: AbstractBaseUser,
                          request: HttpRequest | None = None) -> list[bool]:
    return [do_set_node_role(node, role, actor=actor, request=request) for node in nodes]


@transaction.atomic
def do_remove_node(node: Node, *, actor: AbstractBaseUser, reason,
                   request: HttpRequest | None = None, now: datetime | None = None) -> bool:
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
    refresh_cluster_statuses([node.cluster_id], actor=actor, now=now)
    return True


def prune_event_receipts(now=None):
    """Receipts of agent events older than CLUSTERUI_EVENT_RECEIPT_RETENTION_DAYS go (an
    event resent after that is stored again). Returns how many."""
    now = now or timezone.now()
    cutoff = now - timedelta(days=settings.CLUSTERUI_EVENT_RECEIPT_RETENTION_DAYS)
    deleted, _ = AgentEventReceipt.objects.filter(received_at__lt=cutoff).delete()
    return deleted
