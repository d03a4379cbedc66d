"""Writes that change a node's facts. Each refreshes the node's state in its transaction."""

import hashlib
import secrets

from django.db import transaction
from django.utils import timezone

from clusterui.services import record_audit

from .models import AgentToken, Gpu, Node
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
def do_record_hello(node, *, boot_id, agent_version="", gpus=(), now=None):
    """A hello from the node's agent: it is connected; a new boot_id means it rebooted.

    `gpus` is the hello's list of {index, uuid, name, pci_bus_id, memory_total_bytes};
    GPUs not yet in the inventory are added (a GPU missing from it is the health rules').
    """
    now = now or timezone.now()
    node = Node.objects.select_for_update().get(pk=node.pk)
    rebooted = boot_id != node.boot_id
    Node.objects.filter(pk=node.pk).update(
        last_hello_at=now,
        last_seen=now,
        boot_id=boot_id,
        agent_version=agent_version,
        **({"booted_at": now} if rebooted else {}),
    )
    # New GPUs join the inventory; one at an index another GPU holds (a replaced GPU) waits
    # for a repair's verify step or an operator to accept it.
    known = dict(node.gpus.values_list("uuid", "index"))
    taken = set(known.values())
    Gpu.objects.bulk_create(
        [
            Gpu(
                node=node,
                index=gpu["index"],
                uuid=gpu["uuid"],
                name=gpu.get("name") or "",
                pci_bus_id=gpu.get("pci_bus_id") or "",
                memory_total_bytes=gpu.get("memory_total_bytes"),
            )
            for gpu in gpus
            if gpu["uuid"] not in known and gpu["index"] not in taken
        ]
    )
    if not rebooted:
        reason = "agent reconnected"
    else:
        reason = "rebooted (new boot id)" if node.boot_id else "first hello from the agent"
    refresh_node_state(node, reason=reason, now=now)
    node.refresh_from_db()
    return node


@transaction.atomic
def do_pause_node(node, *, actor, reason, request=None, now=None):
    now = now or timezone.now()
    updated = Node.objects.filter(pk=node.pk, paused=False).update(
        paused=True, paused_reason=f"paused by {actor.get_username()}: {reason}"[:255]
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
