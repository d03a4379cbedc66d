"""What the agent consumer does with a frame once it is valid: the database side of ingest.

Synchronous functions, called from AgentConsumer through database_sync_to_async. Samples
never come here (they go to the live store); hellos, events, results and work frames do.
"""

import uuid
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from clusterui.services import record_audit
from healthchecks.catalog import policy_for
from healthchecks.inventory import do_judge_inventory
from healthchecks.services import (
    CHECK_RUNS,
    do_close_health_event,
    do_record_check_result,
    do_record_health_event,
    start_checks_after_hello,
)
from startup.services import config_frame_for, do_hold_for_boot_scripts, do_record_script_run

from . import agent_work
from .models import AgentEventReceipt, AgentToken, Node
from .services import (
    COMMANDS,
    do_issue_node_token,
    do_record_command_result,
    do_record_hello,
    do_register_node,
    find_usable_token,
)
from .states import note_on_timeline


@dataclass(frozen=True)
class HelloOutcome:
    node_id: int = 0
    cluster_id: int = 0
    node_token: str | None = None
    close_code: int | None = None
    reason: str = ""


@dataclass(frozen=True)
class TokenGrant:
    token_id: int
    kind: str
    cluster_id: int
    node_id: int | None


def authenticate(plaintext):
    """The grant for a usable agent token, or None."""
    token = find_usable_token(plaintext)
    if token is None:
        return None
    AgentToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
    return TokenGrant(token.pk, token.kind, token.cluster_id, token.node_id)


def sample_interval_s():
    return settings.CLUSTERUI_SAMPLE_INTERVAL_S


@transaction.atomic
def accept_hello(grant, frame, now=None):
    """Register or find the hello's node, record the hello, and say what to answer."""
    now = now or timezone.now()
    token = AgentToken.objects.usable(now).select_related("cluster").filter(pk=grant.token_id)
    token = token.first()
    if token is None:
        return HelloOutcome(close_code=4401, reason="token revoked or expired")
    node_token = None
    if token.kind == AgentToken.Kind.NODE:
        node = Node.objects.select_related("cluster").get(pk=token.node_id)
        if frame["node"] != node.name:
            return HelloOutcome(close_code=4403, reason=f"this token belongs to node {node.name}")
    else:
        node = Node.objects.filter(cluster=token.cluster, name=frame["node"]).first()
        if node is not None and not token.cluster.allow_rejoin:
            return HelloOutcome(close_code=4403,
                                reason=f"node {node.name} exists and re-join is off")
        action = "node.join" if node is None else "node.rejoin"
        if node is None:
            node = do_register_node(token.cluster, frame["node"], now=now)
        else:
            Node.objects.filter(pk=node.pk).update(
                joined_at=now, acceptance_required=token.cluster.acceptance_tests_enabled)
            note_on_timeline(node, "re-joined with a join token", now=now)
        node_token = do_issue_node_token(node, now=now)
        record_audit(None, action, node, cluster=token.cluster, now=now,
                     changes={"join_token": token.prefix, "boot_id": frame["boot_id"]})
    rebooted = frame["boot_id"] != node.boot_id
    do_record_hello(node, boot_id=frame["boot_id"], agent_version=frame["agent_version"],
                    gpus=frame["gpus"], slurm=frame.get("slurm"), now=now)
    do_judge_inventory(node, now=now)
    start_checks_after_hello(node, rebooted=rebooted, now=now)
    do_hold_for_boot_scripts(node, rebooted=rebooted, now=now)
    return HelloOutcome(node_id=node.pk, cluster_id=node.cluster_id, node_token=node_token)


def severity_of(frame, gpu):
    """An Xid's severity is NVIDIA's catalog's (DESIGN.md), whatever the agent said."""
    kind, _, code = frame["signature"].partition(":")
    if kind == "xid" and code.isdigit():
        return policy_for(int(code), gpu.name if gpu is not None else "").severity
    return frame["severity"]


@transaction.atomic
def ingest_event(node_id, frame, now=None):
    """Store an agent event once (by its id): open, count or clear the node's health event."""
    now = now or timezone.now()
    event_id = uuid.UUID(frame["id"])
    if AgentEventReceipt.objects.filter(event_id=event_id).exists():
        return False
    node = Node.objects.select_related("cluster").get(pk=node_id)
    gpu_uuid = frame.get("gpu_uuid")
    gpu = node.gpus.filter(uuid=gpu_uuid).first() if gpu_uuid else None
    health_event = None
    if frame.get("state") == "cleared":
        open_event = node.health_events.open().filter(
            gpu=gpu, signature=frame["signature"]).first()
        if open_event is not None:
            do_close_health_event(open_event, reason="cleared by the agent", now=now)
            health_event = open_event
    else:
        evidence = {**(frame.get("detail") or {}), "agent_ts": frame["ts"],
                    "agent_severity": frame["severity"]}
        if gpu_uuid and gpu is None:
            evidence["gpu_uuid"] = gpu_uuid
        health_event = do_record_health_event(
            node, signature=frame["signature"], severity=severity_of(frame, gpu),
            message=frame["message"], gpu=gpu, evidence=evidence,
            count=frame.get("count") or 1, now=now,
        )
    AgentEventReceipt.objects.create(event_id=event_id, node=node, received_at=now,
                                     health_event=health_event)
    return True


# The kinds of work an agent is sent (nodes.agent_work), in the order a hello sends them.
WORK_KINDS = {kind.name: kind for kind in (CHECK_RUNS, COMMANDS)}


def work_frames_after_hello(node_id, now=None):
    """Frames of every piece of work not yet answered, to send after a hello."""
    return agent_work.frames_after_hello(WORK_KINDS.values(), node_id, now=now)


def work_frames(node_id, kind_name, work_ids, now=None):
    """Frames of the work the publisher offered (an unknown kind: none)."""
    kind = WORK_KINDS.get(kind_name)
    return [] if kind is None else agent_work.frames_for(kind, node_id, work_ids, now=now)


def record_check_result(node_id, frame, now=None):
    """True when the result belonged to one of the node's runs."""
    node = Node.objects.get(pk=node_id)
    run = do_record_check_result(node, run_id=frame["run_id"], status=frame["status"],
                                 metrics=frame.get("metrics"), message=frame.get("message") or "",
                                 now=now)
    return run is not None


def record_command_result(node_id, frame, now=None):
    """True when the result belonged to one of the node's commands."""
    node = Node.objects.get(pk=node_id)
    command = do_record_command_result(node, command_id=frame["id"], status=frame["status"],
                                       message=frame.get("message") or "", now=now)
    return command is not None


def config_frame(node_id):
    """The `config` frame for the node: its cluster's startup scripts for its role."""
    return config_frame_for(node_id, sample_interval_s())


def record_script_result(node_id, frame, now=None):
    """Store a script_result frame (startup.services.do_record_script_run)."""
    node = Node.objects.select_related("cluster").get(pk=node_id)
    return do_record_script_run(node, frame, now=now)
