"""What the agent consumer does with a frame once it is valid: the database side of ingest.

Synchronous functions, called from AgentConsumer through database_sync_to_async. Samples
never come here (they go to the live store); hellos, events, results and work frames do.
"""

import enum
import logging
import uuid
from collections import defaultdict
from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from clusters.services import record_audit
from common.bulk_sql import column, insert_rows, one_of, select, table
from healthchecks.xid_catalog import policy_for, xid_code
from healthchecks.gpu_lost import do_judge_inventory
from healthchecks.services import (
    CHECK_RUNS,
    Signal,
    do_record_check_result,
    do_record_health_event,
    do_record_signals,
    open_event_ids,
    start_checks_after_hello,
)
from startup.services import config_frame_for, do_hold_for_boot_scripts, do_record_script_run

from nodes import agent_work
from nodes.models import AgentEventReceipt, AgentToken, Gpu, Node
from nodes.services import (
    COMMANDS,
    do_close_rejoin,
    do_issue_node_token,
    do_record_command_result,
    do_record_hello,
    do_register_node,
    opened_by_a_repair,
    rejoin_opening,
    use_join_token,
)
from nodes.states import note_on_timeline

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenGrant:
    token_id: int
    kind: str
    cluster_id: int
    node_id: int | None
    node_name: str = ""  # a node token's node

    @classmethod
    def of(cls, token):
        return cls(token.pk, token.kind, token.cluster_id, token.node_id,
                   token.node.name if token.node_id is not None else "")


@dataclass(frozen=True)
class HelloOutcome:
    node_id: int = 0
    cluster_id: int = 0
    node_token: str | None = None
    grant: TokenGrant | None = None  # after a join: the connection goes on as the new token's
    close_code: int | None = None
    reason: str = ""


def grant_usable(grant, now=None):
    """Whether the connection's token still works and its node still exists (a revoked token
    or a removed node closes the connection: PROTOCOL.md, 4401)."""
    tokens = AgentToken.objects.usable(now or timezone.now()).filter(pk=grant.token_id)
    if grant.node_id is not None:
        tokens = tokens.filter(node_id=grant.node_id)
    return tokens.exists()


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
    node_token = new_grant = None
    if token.kind == AgentToken.Kind.NODE:
        node = Node.objects.select_related("cluster").get(pk=token.node_id)
        if frame["node"] != node.name:
            return HelloOutcome(close_code=4403, reason=f"this token belongs to node {node.name}")
    else:
        node, refusal = _join(token, frame, now)
        if refusal is not None:
            return refusal
        issued, node_token = do_issue_node_token(node, now=now)
        new_grant = TokenGrant.of(issued)
    rebooted = frame["boot_id"] != node.boot_id
    do_record_hello(node, boot_id=frame["boot_id"], agent_version=frame["agent_version"],
                    gpus=frame["gpus"], slurm=frame.get("slurm"), now=now)
    do_judge_inventory(node, now=now)
    if frame.get("outbox_dropped"):
        dropped = frame["outbox_dropped"]
        do_record_health_event(
            node, signature=OUTBOX_DROPPED_SIGNATURE, severity="info", count=dropped,
            message=f"the agent's outbox was full: it dropped {dropped} unsent event"
                    f"{'s' if dropped != 1 else ''} (the oldest info events first)",
            evidence={"dropped": dropped}, now=now)
    start_checks_after_hello(node, rebooted=rebooted, now=now)
    do_hold_for_boot_scripts(node, rebooted=rebooted, now=now)
    return HelloOutcome(node_id=node.pk, cluster_id=node.cluster_id, node_token=node_token,
                        grant=new_grant)


def _join(token, frame, now):
    """A join-token hello: (the node it registers or re-joins, None), or (None, the refusal).
    An existing node re-joins only while it is open to re-join (PROTOCOL.md)."""
    name = frame["node"]
    if token.for_node_id is not None and token.for_node.name != name:
        return None, HelloOutcome(close_code=4403, reason=f"this join token is for node "
                                                          f"{token.for_node.name}'s re-join")
    node = Node.objects.select_for_update(of=("self",)).select_related("cluster").filter(
        cluster=token.cluster, name=name).first()
    opening = rejoin_opening(node, now) if node is not None else None
    if node is not None and opening is None:
        return None, HelloOutcome(close_code=4403, reason=(
            f"node {name} exists and is not open to re-join: an admin opens it on its page "
            f"(a reprovision or failover repair opens it while it runs)"))
    if not use_join_token(token, now=now):
        return None, HelloOutcome(close_code=4401, reason="this single-use join token was used")
    audit = {"join_token": token.prefix, "boot_id": frame["boot_id"]}
    if node is None:
        node = do_register_node(token.cluster, name, now=now)
        record_audit(None, "node.join", node, cluster=token.cluster, now=now, changes=audit)
        return node, None
    Node.objects.filter(pk=node.pk).update(
        joined_at=now, acceptance_required=token.cluster.acceptance_tests_enabled)
    note_on_timeline(node, f"re-joined with join token {token.prefix}… ({opening})", now=now)
    record_audit(None, "node.rejoin", node, cluster=token.cluster, now=now,
                 changes={**audit, "open": opening})
    if node.rejoin_open_until is not None and not opened_by_a_repair(node):
        # An admin's opening is for one re-join; a repair's lasts until the repair ends.
        do_close_rejoin(node, reason="re-joined", now=now)
    return node, None


# A hello's outbox_dropped: events the agent had to drop, lost to the console.
OUTBOX_DROPPED_SIGNATURE = "agent_outbox_full"


def severity_of(frame, gpu_name):
    """An Xid's severity is NVIDIA's catalog's (DESIGN.md), whatever the agent said (its
    GPU's model name, "" when unknown, picks the catalog's column)."""
    code = xid_code(frame["signature"])
    if code is not None:
        return policy_for(code, gpu_name).severity
    return frame["severity"]


class EventOutcome(enum.Enum):
    STORED = "stored"
    DUPLICATE = "duplicate"  # received before: acked again, not stored twice
    FAILED = "failed"  # not stored (the database or a bug): the agent sends it again
    OPEN_EVENTS_FULL = "open_events_full"  # it would open one more event than a node may have


def ingest_events(items, now=None):
    """Store a batch of agent events, [(node_id, frame)], each once by its id: open, count or
    clear the nodes' health events. Returns an EventOutcome per item.

    One transaction for the batch; if it fails, each node's events are tried again in a
    transaction of their own, so one node's bad event fails only that node's."""
    now = now or timezone.now()
    try:
        return _ingest_in_transaction(items, now)
    except Exception:
        logger.exception("a batch of %d agent events failed", len(items))
        if not connection.in_atomic_block:
            connection.close_if_unusable_or_obsolete()  # a lost connection: retries reconnect
        if len({node_id for node_id, _ in items}) == 1:
            return [EventOutcome.FAILED] * len(items)
    outcomes = [None] * len(items)
    by_node = defaultdict(list)
    for index, (node_id, _) in enumerate(items):
        by_node[node_id].append(index)
    failed_nodes = 0
    for node_id, indexes in by_node.items():
        try:
            node_outcomes = _ingest_in_transaction([items[index] for index in indexes], now)
        except Exception:
            failed_nodes += 1
            if failed_nodes == 1:
                logger.exception("agent events of node %s not stored", node_id)
            node_outcomes = [EventOutcome.FAILED] * len(indexes)
        for index, outcome in zip(indexes, node_outcomes):
            outcomes[index] = outcome
    if failed_nodes > 1:
        logger.error("agent events of %d nodes not stored", failed_nodes)
    return outcomes


class _ReceivedElsewhere(Exception):
    """Another transaction stored some of the batch's events first (a resend on another
    connection): this one rolls back and goes again without them."""


def _ingest_in_transaction(items, now, tries=3):
    for _ in range(tries - 1):
        try:
            with transaction.atomic():
                return _ingest(items, now)
        except _ReceivedElsewhere:
            continue
    with transaction.atomic():
        return _ingest(items, now)


def _as_uuid(value):
    return value if isinstance(value, uuid.UUID) else uuid.UUID(value)


def _ingest(items, now):
    event_ids = [uuid.UUID(frame["id"]) for _, frame in items]
    received = {_as_uuid(value) for (value,) in _select_in(
        AgentEventReceipt, ("event_id",), event_id=event_ids)}
    cluster_of = dict(_select_in(Node, ("id", "cluster"),
                                 id={node_id for node_id, _ in items}))
    named = {frame["gpu_uuid"] for _, frame in items if frame.get("gpu_uuid")}
    gpus = {(node_id, gpu_uuid): (gpu_id, name) for gpu_id, node_id, gpu_uuid, name in
            _select_in(Gpu, ("id", "node", "uuid", "name"), node=cluster_of, uuid=named)
            } if named else {}
    open_ids = open_event_ids(cluster_of)
    full = _nodes_with_open_events_full(open_ids)
    signals, stored = [], []
    outcomes = [EventOutcome.DUPLICATE] * len(items)
    for index, ((node_id, frame), event_id) in enumerate(zip(items, event_ids)):
        if event_id in received:
            continue
        gpu_uuid = frame.get("gpu_uuid")
        gpu_id, gpu_name = gpus.get((node_id, gpu_uuid), (None, "")) if gpu_uuid else (None, "")
        if (node_id in full and frame.get("state") != "cleared"
                and (gpu_id, frame["signature"]) not in full[node_id]):
            outcomes[index] = EventOutcome.OPEN_EVENTS_FULL
            continue
        received.add(event_id)  # the same id twice in one batch: the second is a duplicate
        if frame.get("state") == "cleared":
            signal = Signal(node_id=node_id, cluster_id=cluster_of[node_id],
                            signature=frame["signature"], gpu_id=gpu_id, cleared=True,
                            cleared_reason="cleared by the agent")
        else:
            evidence = {**(frame.get("detail") or {}), "agent_ts": frame["ts"],
                        "agent_severity": frame["severity"]}
            if gpu_uuid and gpu_id is None:
                evidence["gpu_uuid"] = gpu_uuid
            signal = Signal(node_id=node_id, cluster_id=cluster_of[node_id],
                            signature=frame["signature"], gpu_id=gpu_id,
                            severity=severity_of(frame, gpu_name), message=frame["message"],
                            evidence=evidence, count=frame.get("count") or 1)
        signals.append(signal)
        stored.append((event_id, node_id))
        outcomes[index] = EventOutcome.STORED
    touched = do_record_signals(signals, now=now, open_ids=open_ids)
    receipts = [(event_id, node_id, health_event_id)
                for (event_id, node_id), health_event_id in zip(stored, touched)]
    if len(insert_receipts(receipts, now)) < len(receipts):
        raise _ReceivedElsewhere()
    return outcomes


def _select_in(model, field_names, **one_of_each):
    """The rows (field_names' values) whose fields each hold one of the values given."""
    where, params = [], []
    for name, values in one_of_each.items():
        sql, values_param = one_of(model, name, values)
        where.append(sql)
        params += values_param
    return select(f"SELECT {', '.join(column(model, name) for name in field_names)} "
                  f"FROM {table(model)} WHERE {' AND '.join(where)}", params)


def _nodes_with_open_events_full(open_ids):
    """{node_id: its open (gpu_id, signature)} of each node at CLUSTERUI_AGENT_OPEN_EVENTS_MAX
    open events, of open_event_ids(): a repeat or a clear of those is taken, a new signature
    is not. (Checked once a batch: one batch may take a node past the cap.)"""
    cap = settings.CLUSTERUI_AGENT_OPEN_EVENTS_MAX
    keys = defaultdict(set)
    for node_id, gpu_id, signature in open_ids:
        keys[node_id].add((gpu_id, signature))
    return {node_id: found for node_id, found in keys.items() if len(found) >= cap}


def event_received(event_id):
    """Whether an event of this id was stored before (a resend)."""
    return AgentEventReceipt.objects.filter(event_id=uuid.UUID(event_id)).exists()


def insert_receipts(receipts, now):
    """Insert a receipt per (event_id, node_id, health_event_id) not received before; the
    ids inserted. Of two transactions inserting one id, the second waits for the first to
    commit and then gets nothing: an event is stored once however many connections resend
    it."""
    rows = insert_rows(AgentEventReceipt, ("event_id", "node", "received_at", "health_event"),
                       [(event_id, node_id, now, health_event_id)
                        for event_id, node_id, health_event_id in receipts],
                       returning=("event_id",), conflict_do_nothing=True)
    return {value if isinstance(value, uuid.UUID) else uuid.UUID(value) for (value,) in rows}


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


def frames_after_welcome(node_id):
    """What follows a welcome: config, then every piece of work still owed."""
    return [config_frame(node_id), *work_frames_after_hello(node_id)]


def config_frame(node_id):
    """The `config` frame for the node: its cluster's startup scripts for its role."""
    return config_frame_for(node_id, sample_interval_s())


def record_script_result(node_id, frame, now=None):
    """Store a script_result frame (startup.services.do_record_script_run)."""
    node = Node.objects.select_related("cluster").get(pk=node_id)
    return do_record_script_run(node, frame, now=now)
