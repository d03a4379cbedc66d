"""Agent tokens (PROTOCOL.md "Connecting"): join tokens and node tokens, random, shown
once, stored as a SHA-256 hash."""

import hashlib
import secrets
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone

from clusters.change_feed import Kind, record_change
from clusters.models import Cluster
from clusters.services import record_audit

from ..models import AgentToken, Node


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
def do_issue_join_token(cluster: Cluster, *, actor: AbstractBaseUser | None = None, expires_at=None,
                        single_use=False, for_node=None, note="",
                        request: HttpRequest | None = None,
                        now: datetime | None = None) -> tuple[AgentToken, str]:
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
def do_revoke_agent_token(token, *, actor: AbstractBaseUser | None = None,
                          request: HttpRequest | None = None, now: datetime | None = None) -> bool:
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
def do_issue_node_token(node: Node, *, now: datetime | None = None) -> tuple[AgentToken, str]:
    """A fresh node token; the node's earlier tokens stop working (a re-joined node).
    Returns (token, plaintext)."""
    AgentToken.objects.filter(node=node, revoked_at__isnull=True).update(
        revoked_at=now or timezone.now()
    )
    return _new_token(AgentToken.Kind.NODE, node.cluster, node=node)


def use_join_token(token, *, now):
    """A join token is about to register or re-join a node: its use is noted (the cluster's
    settings page shows it), and a single-use one is spent now. False when another hello
    spent it first (the caller refuses this one)."""
    if not token.single_use:
        # A thousand nodes may join with this token at once. Noted inside each join's
        # transaction, its row would stay locked until that join commits, and the joins
        # would take turns; noted after, each lock lasts one statement.
        transaction.on_commit(lambda: AgentToken.objects.filter(pk=token.pk).update(
            last_used_at=now), robust=True)
        return True
    return AgentToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
        revoked_at=now, last_used_at=now) == 1


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
