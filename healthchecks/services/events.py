"""Health events: passive signals from agents and the server, and operators' actions on
them (acknowledge, resolve, silence)."""

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import IntegrityError, models, transaction
from django.db.models import Case, F, Value, When
from django.db.models.functions import Greatest
from django.http import HttpRequest
from django.utils import timezone

from clusters.change_feed import Kind, record_change, record_changes
from clusters.services import record_audit
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
    signal = Signal(node=node, signature=signature, gpu=gpu, severity=severity,
                    message=message, evidence=evidence or {}, count=count)
    return do_record_signals([signal], source=source, now=now)[0]


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
    """One report of a (node, GPU, signature): it happened `count` times, or it cleared."""

    node: Node
    signature: str
    gpu: Gpu | None = None
    severity: str = Severity.WARNING
    message: str = ""
    evidence: dict = field(default_factory=dict)
    count: int = 1
    cleared: bool = False
    cleared_reason: str = ""

    @property
    def key(self):
        return (self.node.pk, self.gpu.pk if self.gpu is not None else None, self.signature)


@dataclass
class _Run:
    """Consecutive signals of one key taken as one: repeats summed, or one clear."""

    signal: Signal
    count: int
    message: str
    indexes: list


@transaction.atomic
def do_record_signals(signals, *, source=Source.PASSIVE,
                      now: datetime | None = None) -> list[HealthEvent | None]:
    """Signals, in order, each as one at a time would take it: a repeat counts on the open
    event of its (node, GPU, signature), else opens one; a clear closes the open one. Built
    for a batch of agent events: consecutive repeats of a key are summed, and each kind of
    write is one query for the whole batch (round by round where a key opens and clears
    more than once); each node whose events opened or closed has its facts refreshed once.

    Safe under concurrency: the database allows one open event per (node, GPU, signature);
    a signal that loses the race to open it counts on the winner's event.

    A notice (healthchecks.signatures: slurmd restarted, a job's cleanup) is an event of its
    own, closed as it is recorded; a clear of one changes nothing.

    Returns, per signal, the event it opened, counted on or closed (None: a clear with
    nothing open)."""
    now = now or timezone.now()
    notice_at = [is_notice(signal.signature) for signal in signals]
    if not any(notice_at):
        return _record_conditions(signals, source, now)
    touched = [None] * len(signals)
    notices = [i for i, signal in enumerate(signals) if notice_at[i] and not signal.cleared]
    for i, event in zip(notices, _record_notices([signals[i] for i in notices], source, now)):
        touched[i] = event
    others = [i for i in range(len(signals)) if not notice_at[i]]
    for i, event in zip(others, _record_conditions([signals[i] for i in others], source, now)):
        touched[i] = event
    return touched


NOTICE_CLOSED_REASON = "a notice: recorded as it happened"


def _record_notices(signals, source, now):
    """Each notice as an event of its own, closed at once (one insert)."""
    events = HealthEvent.objects.bulk_create([
        HealthEvent(node=signal.node, gpu=signal.gpu, signature=signal.signature,
                    severity=signal.severity, source=source, message=signal.message,
                    evidence=signal.evidence, first_seen=now, last_seen=now,
                    count=signal.count, closed_at=now, closed_reason=NOTICE_CLOSED_REASON)
        for signal in signals])
    record_changes(Kind.HEALTH_EVENT, [(signal.node.cluster_id, event.node_id, event.pk)
                                       for signal, event in zip(signals, events)], now=now)
    return events


def _record_conditions(signals, source, now):
    node_ids = {signal.node.pk for signal in signals}
    open_events = {
        (event.node_id, event.gpu_id, event.signature): event
        for event in HealthEvent.objects.open().filter(node_id__in=node_ids)
        .select_related("node").only("node_id", "gpu_id", "signature", "node__cluster_id")
    }
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
        closed = _close_runs([run for run in this_round if run.signal.cleared], open_events,
                             now)
        counted, to_open = _count_runs(
            [run for run in this_round if not run.signal.cleared], open_events, now)
        opened, counted_on_winner = _open_runs(to_open, source, open_events, now)
        for run, event in closed:
            announced[Kind.HEALTH_EVENT].append(event)
            refresh.setdefault(event.node_id, f"{event.signature} closed: "
                                              f"{run.signal.cleared_reason}")
        for run, event in opened:
            announced[Kind.HEALTH_EVENT].append(event)
            refresh.setdefault(event.node_id, f"{event.signature} opened")
        for run, event in counted + counted_on_winner:
            announced[Kind.HEALTH_REPEAT].append(event)
        for run, event in closed + counted + opened + counted_on_winner:
            for index in run.indexes:
                touched[index] = event
    for kind, events in announced.items():
        record_changes(kind, [(event.node.cluster_id, event.node_id, event.pk)
                              for event in events], now=now)
    if refresh:
        refresh_health_facts_of(refresh, now=now)
    return touched


def _close_runs(runs, open_events, now):
    """[(run, event)] of the clears that closed an open event, in one update per reason."""
    by_reason = {}
    for run in runs:
        event = open_events.pop(run.signal.key, None)
        if event is not None:
            by_reason.setdefault(run.signal.cleared_reason, []).append((run, event))
    closed = []
    for reason, pairs in by_reason.items():
        ids = [event.pk for _, event in pairs]
        updated = HealthEvent.objects.filter(pk__in=ids, closed_at__isnull=True).update(
            closed_at=now, closed_reason=reason[:255])
        if updated < len(ids):  # some closed since they were read: not by this clear
            ids = set(HealthEvent.objects.filter(pk__in=ids, closed_at=now,
                                                 closed_reason=reason[:255])
                      .values_list("pk", flat=True))
        closed += [(run, event) for run, event in pairs if event.pk in ids]
    return closed


def _count_runs(runs, open_events, now):
    """Count the runs on their keys' open events in one update: ([(run, event)] counted,
    [run] whose key has no open event, or whose event closed meanwhile)."""
    on_open = [(run, open_events[run.signal.key]) for run in runs
               if run.signal.key in open_events]
    to_open = [run for run in runs if run.signal.key not in open_events]
    if not on_open:
        return [], to_open
    ids = [event.pk for _, event in on_open]
    # One WHEN per distinct count and per distinct message, not per event: Django takes
    # longer to build a CASE of 500 WHENs than PostgreSQL takes to run it.
    by_count, by_message = defaultdict(list), defaultdict(list)
    for run, event in on_open:
        by_count[run.count].append(event.pk)
        if run.message:
            by_message[run.message].append(event.pk)
    changes = {
        "count": F("count") + Case(*[When(pk__in=pks, then=Value(count))
                                     for count, pks in by_count.items()],
                                   output_field=models.IntegerField()),
        "last_seen": Greatest("last_seen", Value(now)),
    }
    if by_message:
        changes["message"] = Case(*[When(pk__in=pks, then=Value(message))
                                    for message, pks in by_message.items()],
                                  default=F("message"))
    updated = HealthEvent.objects.filter(pk__in=ids, closed_at__isnull=True).update(**changes)
    if updated == len(ids):
        return on_open, to_open
    # Some closed since they were read (an operator, a sweep): those open a new event.
    still_open = set(HealthEvent.objects.open().filter(pk__in=ids).values_list("pk", flat=True))
    for run, event in on_open:
        if event.pk not in still_open:
            open_events.pop(run.signal.key)
            to_open.append(run)
    return [(run, event) for run, event in on_open if event.pk in still_open], to_open


def _open_runs(runs, source, open_events, now):
    """Open an event per run, in one insert: ([(run, event)] opened, [(run, event)] counted
    on an event another writer opened first)."""
    if not runs:
        return [], []
    windows = maintenance.current({run.signal.node.cluster_id for run in runs}, now)
    new = [HealthEvent(node=run.signal.node, gpu=run.signal.gpu, signature=run.signal.signature,
                       severity=run.signal.severity, source=source, message=run.message,
                       evidence=run.signal.evidence, first_seen=now, last_seen=now,
                       count=run.count, in_maintenance=maintenance.occurrence_for(
                           run.signal.node, occurrences=windows) is not None)
           for run in runs]
    try:
        with transaction.atomic():
            events = HealthEvent.objects.bulk_create(new)
    except IntegrityError:  # one of them was opened a moment ago elsewhere: one at a time
        return _open_runs_one_by_one(runs, source, open_events, now)
    opened = list(zip(runs, events))
    for run, event in opened:
        open_events[run.signal.key] = event
    return opened, []


def _open_runs_one_by_one(runs, source, open_events, now):
    opened, counted = [], []
    for run in runs:
        signal = run.signal
        same = HealthEvent.objects.open().filter(node=signal.node, gpu=signal.gpu,
                                                 signature=signal.signature)
        for _ in range(2):
            event = same.select_related("node").first()
            if event is not None:
                done, _ = _count_runs([run], {signal.key: event}, now)
                if done:
                    counted.append((run, event))
                    break
                continue
            try:
                with transaction.atomic():
                    event = HealthEvent.objects.create(
                        node=signal.node, gpu=signal.gpu, signature=signal.signature,
                        severity=signal.severity, source=source, message=run.message,
                        evidence=signal.evidence, first_seen=now, last_seen=now,
                        count=run.count, in_maintenance=maintenance.occurrence_for(
                            signal.node, now) is not None)
            except IntegrityError:
                continue  # opened a moment ago by another writer: count on that one
            opened.append((run, event))
            break
        else:
            raise RuntimeError(f"cannot record {signal.signature} on {signal.node}: the open "
                               f"event keeps changing")
        open_events[signal.key] = event
    return opened, counted


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


def refresh_ended_silences(since, now=None):
    """Nodes whose silence ended between `since` and now get their state recomputed."""
    now = now or timezone.now()
    ended = Silence.objects.filter(until__gt=since, until__lte=now).select_related("node")
    for silence in ended:
        refresh_health_facts(silence.node, reason=f"silence on {silence.signature} ended",
                             now=now)
    return len(ended)


# Active checks: runs asked of a node's agent, their results, and what follows from them.
