"""Health events: passive signals from agents and the server, and operators' actions on
them (acknowledge, resolve, silence)."""

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone

from clusters.change_feed import Kind, record_change, record_changes, record_changes_of_kinds
from clusters.services import record_audit
from common.bulk_sql import column, insert_rows, one_of, qualified, select, table, update_rows
from nodes import maintenance
from nodes.models import Gpu, Node

from ..choices import Severity, Source
from ..models import HealthEvent, Silence
from ..signatures import is_notice
from .facts import refresh_health_facts, refresh_health_facts_of


def announce_health_change(event, kind=Kind.HEALTH_EVENT):
    """A change row for the event (in the caller's transaction): the open Health checks tabs
    of its cluster re-fetch, and, unless it is only a repeat counted (Kind.HEALTH_REPEAT:
    no recommendation depends on a count), the recommender looks at its node again."""
    record_change(kind, cluster_id=event.node.cluster_id, node_id=event.node_id,
                  object_id=event.pk)


@transaction.atomic
def do_record_health_event(
    node: Node, *, signature, severity, message="", gpu=None, evidence=None,
    source=Source.PASSIVE, count=1, now: datetime | None = None,
) -> HealthEvent:
    """Open an event, or raise the count of the open one with the same (node, GPU, signature)."""
    signal = Signal(node_id=node.pk, cluster_id=node.cluster_id, signature=signature,
                    gpu_id=gpu.pk if gpu is not None else None, severity=severity,
                    message=message, evidence=evidence or {}, count=count)
    event_id = do_record_signals([signal], source=source, now=now)[0]
    return HealthEvent.objects.select_related("node", "gpu").get(pk=event_id)


def _close(event, *, reason, actor, now):
    """Close the event if it is open; whether it was."""
    return bool(HealthEvent.objects.filter(pk=event.pk, closed_at__isnull=True).update(
        closed_at=now, closed_reason=reason[:255], closed_by=actor))


@transaction.atomic
def do_close_health_event(event, *, reason, actor: AbstractBaseUser | None = None,
                          now: datetime | None = None) -> bool:
    now = now or timezone.now()
    closed = _close(event, reason=reason, actor=actor, now=now)
    if closed:
        announce_health_change(event)
        refresh_health_facts(event.node, actor=actor,
                             reason=f"{event.signature} closed: {reason}", now=now)
    event.refresh_from_db()
    return closed


@dataclass
class Signal:
    """One report of a (node, GPU, signature): it happened `count` times, or it cleared.
    Ids, not model objects: a batch of agent events builds hundreds."""

    node_id: int
    cluster_id: int
    signature: str
    gpu_id: int | None = None
    severity: str = Severity.WARNING
    message: str = ""
    evidence: dict = field(default_factory=dict)
    count: int = 1
    cleared: bool = False
    cleared_reason: str = ""

    @property
    def key(self):
        return (self.node_id, self.gpu_id, self.signature)


@dataclass
class _Run:
    """Consecutive signals of one key taken as one: repeats summed, or one clear."""

    signal: Signal
    count: int
    message: str
    indexes: list


@transaction.atomic(savepoint=False)
def do_record_signals(signals, *, source=Source.PASSIVE, now: datetime | None = None,
                      open_ids=None) -> list[int | None]:
    """Signals, in order, each as one at a time would take it: a repeat counts on the open
    event of its (node, GPU, signature), else opens one; a clear closes the open one. Built
    for a batch of agent events: consecutive repeats of a key are summed, and each kind of
    write is one statement for the whole batch (round by round where a key opens and clears
    more than once); each node whose events opened or closed has its facts refreshed once.
    The writes are SQL (common.bulk_sql): this runs for every batch of agent events.

    Safe under concurrency: the database allows one open event per (node, GPU, signature);
    a signal that loses the race to open it counts on the winner's event.

    A notice (healthchecks.signatures: slurmd restarted, a job's cleanup) is an event of its
    own, closed as it is recorded; a clear of one changes nothing.

    `open_ids`: open_event_ids() of the signals' nodes when the caller has read them (this
    takes them over); else they are read here.

    Returns, per signal, the id of the event it opened, counted on or closed (None: a clear
    with nothing open)."""
    now = now or timezone.now()
    notice_at = [is_notice(signal.signature) for signal in signals]
    if not any(notice_at):
        return _record_conditions(signals, source, now, open_ids)
    touched = [None] * len(signals)
    notices = [i for i, signal in enumerate(signals) if notice_at[i] and not signal.cleared]
    for i, event_id in zip(notices, _record_notices([signals[i] for i in notices], source, now)):
        touched[i] = event_id
    others = [i for i in range(len(signals)) if not notice_at[i]]
    for i, event_id in zip(others, _record_conditions([signals[i] for i in others], source,
                                                       now, open_ids)):
        touched[i] = event_id
    return touched


NOTICE_CLOSED_REASON = "a notice: recorded as it happened"
# The columns an agent's event is inserted with (the others keep their defaults: NULL).
_INSERTED = ("public_id", "node", "gpu", "signature", "severity", "source", "message",
             "evidence", "first_seen", "last_seen", "count", "closed_at", "closed_reason",
             "in_maintenance")


def _event_row(signal, source, now, *, message, count, closed_at=None, closed_reason="",
               in_maintenance=False):
    return (uuid.uuid4(), signal.node_id, signal.gpu_id, signal.signature, signal.severity,
            source, message, signal.evidence, now, now, count, closed_at, closed_reason,
            in_maintenance)


def _record_notices(signals, source, now):
    """Each notice as an event of its own, closed at once (one insert): their ids."""
    # Inserted in order, ids returned in order (as the ORM's bulk_create takes them).
    ids = [event_id for (event_id,) in insert_rows(HealthEvent, _INSERTED, [
        _event_row(signal, source, now, message=signal.message, count=signal.count,
                   closed_at=now, closed_reason=NOTICE_CLOSED_REASON)
        for signal in signals], returning=("id",))]
    record_changes(Kind.HEALTH_EVENT, [(signal.cluster_id, signal.node_id, event_id)
                                       for signal, event_id in zip(signals, ids)], now=now)
    return ids


def open_event_ids(node_ids):
    """{(node_id, gpu_id, signature): id} of the nodes' open events (one SELECT)."""
    if not node_ids:
        return {}
    event = HealthEvent
    where, params = one_of(event, "node", node_ids)
    names = ", ".join(column(event, name) for name in ("node", "gpu", "signature", "id"))
    return {(node_id, gpu_id, signature): event_id
            for node_id, gpu_id, signature, event_id in select(
                f"SELECT {names} FROM {table(event)} "
                f"WHERE {qualified(event, 'closed_at')} IS NULL AND {where}", params)}


def _record_conditions(signals, source, now, open_ids=None):
    if open_ids is None:
        open_ids = open_event_ids({signal.node_id for signal in signals})
    runs_of_key = {}
    for index, signal in enumerate(signals):
        runs = runs_of_key.setdefault(signal.key, [])
        if runs and not signal.cleared and not runs[-1].signal.cleared:
            runs[-1].count += signal.count
            runs[-1].message = signal.message or runs[-1].message
            runs[-1].indexes.append(index)
        else:
            runs.append(_Run(signal, signal.count, signal.message, [index]))
    touched = [None] * len(signals)
    announced = {Kind.HEALTH_EVENT: [], Kind.HEALTH_REPEAT: []}
    refresh = {}
    for round_index in range(max(map(len, runs_of_key.values()), default=0)):
        this_round = [runs[round_index] for runs in runs_of_key.values()
                      if len(runs) > round_index]
        closed = _close_runs([run for run in this_round if run.signal.cleared], open_ids, now)
        counted, to_open = _count_runs(
            [run for run in this_round if not run.signal.cleared], open_ids, now)
        opened, counted_on_winner = _open_runs(to_open, source, open_ids, now)
        for run, _ in closed:
            refresh.setdefault(run.signal.node_id, f"{run.signal.signature} closed: "
                                                   f"{run.signal.cleared_reason}")
        for run, _ in opened:
            refresh.setdefault(run.signal.node_id, f"{run.signal.signature} opened")
        announced[Kind.HEALTH_EVENT] += closed + opened
        announced[Kind.HEALTH_REPEAT] += counted + counted_on_winner
        for run, event_id in closed + counted + opened + counted_on_winner:
            for index in run.indexes:
                touched[index] = event_id
    record_changes_of_kinds([(kind, run.signal.cluster_id, run.signal.node_id, event_id)
                             for kind, pairs in announced.items() for run, event_id in pairs],
                            now=now)
    if refresh:
        refresh_health_facts_of(refresh, now=now)
    return touched


def _close_runs(runs, open_ids, now):
    """[(run, event id)] of the clears that closed an open event, in one update per reason."""
    by_reason = {}
    for run in runs:
        event_id = open_ids.pop(run.signal.key, None)
        if event_id is not None:
            by_reason.setdefault(run.signal.cleared_reason, []).append((run, event_id))
    closed = []
    for reason, pairs in by_reason.items():
        # Only those still open: one an operator or a sweep closed meanwhile is not this one's.
        ids = set(update_rows(
            HealthEvent, ("closed_at", "closed_reason"),
            [(event_id, now, reason[:255]) for _, event_id in pairs],
            where=f"{qualified(HealthEvent, 'closed_at')} IS NULL", returning=True))
        closed += [(run, event_id) for run, event_id in pairs if event_id in ids]
    return closed


# How a run's count, time and message go onto its open event.
COUNTED_ON = {
    "count": "{old} + {new}",
    "last_seen": "CASE WHEN {old} > {new} THEN {old} ELSE {new} END",
    "message": "CASE WHEN {new} = '' THEN {old} ELSE {new} END",
}


def _count_runs(runs, open_ids, now):
    """Count the runs on their keys' open events in one update: ([(run, event id)] counted,
    [run] whose key has no open event, or whose event closed meanwhile)."""
    on_open = [(run, open_ids[run.signal.key]) for run in runs if run.signal.key in open_ids]
    to_open = [run for run in runs if run.signal.key not in open_ids]
    if not on_open:
        return [], to_open
    still_open = set(update_rows(
        HealthEvent, ("count", "last_seen", "message"),
        [(event_id, run.count, now, run.message) for run, event_id in on_open],
        combine=COUNTED_ON, where=f"{qualified(HealthEvent, 'closed_at')} IS NULL",
        returning=True))
    # One closed since it was read (an operator, a sweep): its run opens a new event.
    for run, event_id in on_open:
        if event_id not in still_open:
            open_ids.pop(run.signal.key)
            to_open.append(run)
    return [(run, event_id) for run, event_id in on_open if event_id in still_open], to_open


OPEN_TRIES = 3


def _open_runs(runs, source, open_ids, now):
    """Open an event per run, in one insert: ([(run, event id)] opened, [(run, event id)]
    counted on an event another writer opened first)."""
    opened, counted = [], []
    for _ in range(OPEN_TRIES):
        if not runs:
            return opened, counted
        windows = maintenance.current({run.signal.cluster_id for run in runs}, now)
        rows = insert_rows(HealthEvent, _INSERTED, [
            _event_row(run.signal, source, now, message=run.message, count=run.count,
                       in_maintenance=maintenance.covering(
                           windows, run.signal.cluster_id, run.signal.node_id) is not None)
            for run in runs], returning=("id", "node", "gpu", "signature"),
            conflict_do_nothing=True)
        inserted = {(node_id, gpu_id, signature): event_id
                    for event_id, node_id, gpu_id, signature in rows}
        lost = []
        for run in runs:
            event_id = inserted.get(run.signal.key)
            if event_id is None:
                lost.append(run)
            else:
                open_ids[run.signal.key] = event_id
                opened.append((run, event_id))
        if not lost:
            return opened, counted
        # Another writer opened these a moment ago: count on its events (or, if those closed
        # already, open again).
        open_ids.update({key: event_id for key, event_id in open_event_ids(
            {run.signal.node_id for run in lost}).items()
            if key in {run.signal.key for run in lost}})
        counted_now, runs = _count_runs(lost, open_ids, now)
        counted += counted_now
    raise RuntimeError(f"cannot record {runs[0].signal.signature} on node "
                       f"{runs[0].signal.node_id}: the open event keeps changing")


@transaction.atomic
def do_acknowledge_event(event, *, actor: AbstractBaseUser, request: HttpRequest | None = None,
                         now: datetime | None = None) -> bool:
    """A person knows about it: the event stays open, marked with who and when."""
    now = now or timezone.now()
    done = HealthEvent.objects.filter(
        pk=event.pk, closed_at__isnull=True, acknowledged_at__isnull=True
    ).update(acknowledged_by=actor, acknowledged_at=now)
    if done:
        record_audit(actor, "healthevent.acknowledge", event, cluster=event.node.cluster,
                     request=request, now=now)
        announce_health_change(event)
    event.refresh_from_db()
    return bool(done)


@transaction.atomic
def do_resolve_event(event, *, actor: AbstractBaseUser, comment, request: HttpRequest | None = None,
                     now: datetime | None = None) -> bool:
    """An operator closes an event by hand, saying why (DESIGN.md: edge signals need it)."""
    now = now or timezone.now()
    closed = do_close_health_event(
        event, reason=f"resolved by {actor.get_username()}: {comment}", actor=actor, now=now)
    if closed:
        record_audit(actor, "healthevent.resolve", event, changes={"comment": comment},
                     cluster=event.node.cluster, request=request, now=now)
    return closed


@transaction.atomic
def do_silence_signature(node: Node, *, signature, hours, reason, actor: AbstractBaseUser,
                         request: HttpRequest | None = None,
                         now: datetime | None = None) -> Silence:
    """Events of `signature` on `node` stop counting against it for `hours`."""
    now = now or timezone.now()
    silence = Silence.objects.create(
        node=node, signature=signature, reason=reason, until=now + timedelta(hours=hours),
        created_at=now, created_by=actor)
    record_audit(actor, "silence.create", silence, cluster=node.cluster, request=request,
                 changes={"signature": signature, "hours": hours, "reason": reason}, now=now)
    refresh_health_facts(node, actor=actor, reason=f"{signature} silenced for {hours:g} h",
                         now=now)
    return silence


QUIET_XID_CLOSES_AFTER = timedelta(hours=1)


def close_quiet_events(now=None):
    """Xids NVIDIA's catalog does not count against the node close after an hour without a
    repeat (DESIGN.md's closing rules). Returns how many closed."""
    now = now or timezone.now()
    closed = 0
    quiet = HealthEvent.objects.open().filter(
        signature__startswith="xid:", severity=Severity.INFO,
        last_seen__lte=now - QUIET_XID_CLOSES_AFTER)
    for event in quiet.select_related("node"):
        closed += do_close_health_event(event, reason="no repeat for an hour", now=now)
    return closed


def prune_closed_events(now=None):
    """Events closed more than CLUSTERUI_CLOSED_EVENT_RETENTION_DAYS ago go, except those a
    repair names as its evidence: a repair's record keeps what it was for. Returns how many."""
    now = now or timezone.now()
    cutoff = now - timedelta(days=settings.CLUSTERUI_CLOSED_EVENT_RETENTION_DAYS)
    _, deleted = HealthEvent.objects.filter(closed_at__lt=cutoff, repairs__isnull=True).delete()
    return deleted.get(HealthEvent._meta.label, 0)


def refresh_ended_silences(since, now=None):
    """Nodes whose silence ended between `since` and now get their state recomputed."""
    now = now or timezone.now()
    ended = Silence.objects.filter(until__gt=since, until__lte=now).select_related("node")
    for silence in ended:
        refresh_health_facts(silence.node, reason=f"silence on {silence.signature} ended",
                             now=now)
    return len(ended)


# Active checks: runs asked of a node's agent, their results, and what follows from them.
