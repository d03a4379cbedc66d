"""Writes for health events and active checks. Each change that matters to a node's state
hands the node its health facts (refresh_health_facts); each change others react to appends
a change row (the publisher pushes "health.changed", the recommender reads it)."""

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import IntegrityError, models, transaction
from django.db.models import Case, Exists, F, OuterRef, Value, When
from django.db.models.functions import Greatest
from django.utils import timezone

from clusterui.changes import Kind, record_change, record_changes
from clusterui.services import record_audit
from nodes import agent_work, maintenance
from nodes.models import Gpu, Node
from nodes.states import refresh_node_states

from .checks import ACCEPTANCE_CHECKS, AFTER_REBOOT_CHECKS, CHECKS, params_for
from .choices import NODE_AFFECTING, Severity, Source
from .models import CheckRun, HealthEvent, Silence
from .signatures import is_notice


def open_problem_events(node, now):
    """The node's open warning/critical events, less signatures an operator silenced,
    critical before warning, then oldest first."""
    return open_problem_events_of([node.pk], now)[node.pk]


def open_problem_events_of(node_ids, now):
    """open_problem_events() of many nodes in one query: {node_id: [event, ...]}."""
    silenced = Silence.objects.active(now).filter(node=OuterRef("node"),
                                                  signature=OuterRef("signature"))
    events = {node_id: [] for node_id in node_ids}
    # "critical" sorts before "warning".
    for event in (HealthEvent.objects.open()
                  .filter(node_id__in=list(node_ids), severity__in=NODE_AFFECTING)
                  .exclude(Exists(silenced))
                  .select_related("gpu")
                  .order_by("severity", "first_seen", "id")):
        events[event.node_id].append(event)
    return events


def describe_open_problems(events):
    """'xid:79 on GPU 3 (+1 more)' for a node's open warning/critical events, worst first."""
    if not events:
        return ""
    worst = events[0]
    text = worst.signature
    if worst.gpu is not None:
        text += f" on GPU {worst.gpu.index}"
    if len(events) > 1:
        text += f" (+{len(events) - 1} more)"
    return text


def announce_health_change(event, kind=Kind.HEALTH_EVENT):
    """A change row for the event (in the caller's transaction): the open Health checks tabs
    of its cluster re-fetch, and, unless it is only a repeat counted (Kind.HEALTH_REPEAT:
    no recommendation depends on a count), the recommender looks at its node again."""
    record_change(kind, cluster_id=event.node.cluster_id, node_id=event.node_id,
                  object_id=event.pk)


def acceptance_detail(node):
    """Where a node's acceptance battery stands: running, or which checks did not pass."""
    latest = latest_runs(node, CheckRun.Purpose.ACCEPTANCE, ACCEPTANCE_CHECKS, node.joined_at)
    if not latest:
        return "acceptance tests have not started"
    if any(run.status in CheckRun.UNFINISHED for run in latest.values()):
        return "running acceptance tests"
    failed = [f"{name} {latest[name].get_status_display()}" for name in ACCEPTANCE_CHECKS
              if name in latest and latest[name].status != CheckRun.Status.PASSED]
    return "acceptance tests did not pass: " + ", ".join(failed) if failed else ""


def health_facts_of(node_ids, now):
    """The facts this app owns (nodes.states.HANDED_DOWN) of each node: {node_id: facts}."""
    nodes = Node.objects.only("acceptance_required", "joined_at", "boot_id").in_bulk(
        list(node_ids))
    problems = open_problem_events_of(nodes, now)
    checks_running = set(
        CheckRun.objects.unfinished()
        .filter(node_id__in=list(nodes), purpose=CheckRun.Purpose.AFTER_REBOOT)
        .values_list("node_id", "boot_id"))
    return {
        node.pk: {
            "open_problem": describe_open_problems(problems[node.pk]),
            "acceptance_detail": acceptance_detail(node) if node.acceptance_required else "",
            "checks_running_for_boot": (node.boot_id if (node.pk, node.boot_id) in checks_running
                                        else ""),
        }
        for node in nodes.values()
    }


def refresh_health_facts(node, *, actor=None, reason="", now=None):
    """Hand the node its health facts and recompute its state (nodes.states)."""
    return node.pk in refresh_health_facts_of({node.pk: reason}, actor=actor, now=now)


def refresh_health_facts_of(reasons, *, actor=None, now=None):
    """refresh_health_facts() of many nodes, {node_id: reason}, in a few queries. Returns the
    ids whose state changed."""
    now = now or timezone.now()
    return refresh_node_states(health_facts_of(reasons, now), actor=actor, reasons=reasons,
                               now=now)


@transaction.atomic
def do_record_health_event(
    node, *, signature, severity, message="", gpu=None, evidence=None,
    source=Source.PASSIVE, count=1, now=None,
):
    """Open an event, or raise the count of the open one with the same (node, GPU, signature)."""
    signal = Signal(node=node, signature=signature, gpu=gpu, severity=severity,
                    message=message, evidence=evidence or {}, count=count)
    return do_record_signals([signal], source=source, now=now)[0]


def _close(event, *, reason, actor, now):
    """Close the event if it is open; whether it was."""
    return bool(HealthEvent.objects.filter(pk=event.pk, closed_at__isnull=True).update(
        closed_at=now, closed_reason=reason[:255], closed_by=actor))


@transaction.atomic
def do_close_health_event(event, *, reason, actor=None, now=None):
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
def do_record_signals(signals, *, source=Source.PASSIVE, now=None):
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
def do_acknowledge_event(event, *, actor, request=None, now=None):
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
def do_resolve_event(event, *, actor, comment, request=None, now=None):
    """An operator closes an event by hand, saying why (DESIGN.md: edge signals need it)."""
    now = now or timezone.now()
    closed = do_close_health_event(
        event, reason=f"resolved by {actor.get_username()}: {comment}", actor=actor, now=now)
    if closed:
        record_audit(actor, "healthevent.resolve", event, changes={"comment": comment},
                     cluster=event.node.cluster, request=request, now=now)
    return closed


@transaction.atomic
def do_silence_signature(node, *, signature, hours, reason, actor, request=None, now=None):
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


def check_signature(check_name):
    """The health event a failing check opens, and a passing one closes."""
    return f"check:{check_name}"


def run_check_frame(run):
    return {"type": "run_check", "run_id": run.pk, "check": run.check_name, "params": run.params}


def _why_late(run):
    if run.sent_at:
        return "no result in time: the agent did not answer"
    return "no result in time: the node's agent was not connected"


def _after_timeout(run, now):
    _after_run_finished(run, now)


# Check runs are one kind of agent work (nodes.agent_work: queued, sent, offered, expired).
CHECK_RUNS = agent_work.WorkKind(
    name="check_run", model=CheckRun, unanswered=CheckRun.UNFINISHED,
    unfinished=CheckRun.UNFINISHED, sent=CheckRun.Status.RUNNING,
    timed_out=CheckRun.Status.TIMED_OUT, frame=run_check_frame, why_late=_why_late,
    after_timeout=_after_timeout,
)


def announce_run_change(run):
    record_change(Kind.CHECK_RUN, cluster_id=run.node.cluster_id, node_id=run.node_id,
                  object_id=run.pk)


@transaction.atomic
def do_request_check(node, check_name, *, purpose=CheckRun.Purpose.ON_DEMAND, actor=None,
                     request=None, reason="", now=None):
    """Ask the node's agent to run a check. Returns (run, created): while the same check is
    still unfinished on the node for the same purpose, that run is returned and no second
    one starts (a double click, two operators)."""
    if check_name not in CHECKS:
        raise ValueError(f"unknown check {check_name!r}")
    now = now or timezone.now()
    node = type(node).objects.select_for_update(no_key=True).get(pk=node.pk)
    running = CheckRun.objects.unfinished().filter(
        node=node, check_name=check_name, purpose=purpose).first()
    if running is not None:
        return running, False
    inventory = node.gpus.in_inventory()
    models = set(inventory.values_list("name", flat=True))
    run = CheckRun.objects.create(
        node=node, check_name=check_name, purpose=purpose, requested_by=actor,
        params=params_for(check_name, models, inventory.count()), requested_at=now,
        boot_id=node.boot_id, deadline_at=now + timedelta(seconds=CHECKS[check_name].deadline_s),
    )
    if actor is not None:
        record_audit(actor, "checkrun.request", run, cluster=node.cluster, request=request,
                     changes={"node": node.name, "check": check_name, "purpose": purpose},
                     now=now)
    agent_work.queue_work(CHECK_RUNS, run, now=now)
    announce_run_change(run)
    if purpose != CheckRun.Purpose.ON_DEMAND:  # acceptance and post-reboot runs hold the node
        refresh_health_facts(node, reason=reason, now=now)
    return run, True


def do_request_checks(node, check_names, *, purpose, actor=None, request=None, reason="",
                      now=None):
    """Several checks at once (a battery); the agent runs them one after another.
    Returns [(run, created)] as do_request_check does."""
    return [
        do_request_check(node, name, purpose=purpose, actor=actor, request=request,
                         reason=reason, now=now)
        for name in check_names
    ]


@transaction.atomic
def do_record_check_result(node, *, run_id, status, metrics=None, message="", now=None):
    """An agent's check_result. Returns the run, or None when the node has no such run.

    A failed check opens (or counts on) the node's `check:<name>` event; a passed one
    closes it. Results for a run already finished (a late answer after its deadline) change
    nothing."""
    now = now or timezone.now()
    run = CheckRun.objects.select_for_update().filter(pk=run_id, node=node).first()
    if run is None or run.is_finished:
        return run
    run.status, run.metrics, run.message, run.finished_at = status, metrics or {}, message, now
    label = CHECKS[run.check_name].label if run.check_name in CHECKS else run.check_name
    signature = check_signature(run.check_name)
    if status == CheckRun.Status.FAILED:
        run.health_event = do_record_health_event(
            node, signature=signature, severity=Severity.WARNING, source=Source.ACTIVE,
            message=message or f"{label} is below its baseline",
            evidence={"run": str(run.public_id), "purpose": run.purpose, "params": run.params,
                      "metrics": run.metrics},
            now=now)
    elif status == CheckRun.Status.PASSED:
        for event in HealthEvent.objects.open().filter(node=node, signature=signature):
            do_close_health_event(event, reason=f"{label} passed", now=now)
    run.save(update_fields=["status", "metrics", "message", "finished_at", "health_event"])
    _after_run_finished(run, now)
    return run


def _after_run_finished(run, now):
    announce_run_change(run)
    if run.purpose == CheckRun.Purpose.ACCEPTANCE:
        judge_acceptance(run.node, now=now)
    elif run.purpose == CheckRun.Purpose.AFTER_REBOOT:
        judge_after_reboot(run.node, boot_id=run.boot_id, now=now)


@transaction.atomic
def do_bulk_request_checks(nodes, check_names, *, purpose, actor=None, request=None):
    """The same checks on several nodes (the Nodes list's bulk form), in one transaction: one
    boolean per node, whether every check started (False: some were running already)."""
    return [all(created for _, created in do_request_checks(
        node, check_names, purpose=purpose, actor=actor, request=request)) for node in nodes]


def latest_runs(node, purpose, check_names, since):
    """{check name: its latest run of this purpose requested since `since`}."""
    runs = CheckRun.objects.filter(node=node, purpose=purpose, check_name__in=check_names,
                                   requested_at__gte=since).order_by("requested_at", "id")
    return {run.check_name: run for run in runs}


def judge_acceptance(node, now=None):
    """A node whose acceptance battery has all passed since it joined is accepted."""
    now = now or timezone.now()
    node.refresh_from_db()
    latest = latest_runs(node, CheckRun.Purpose.ACCEPTANCE, ACCEPTANCE_CHECKS, node.joined_at)
    passed = all(
        name in latest and latest[name].status == CheckRun.Status.PASSED
        for name in ACCEPTANCE_CHECKS
    )
    if passed and (node.acceptance_passed_at is None
                   or node.acceptance_passed_at < node.joined_at):
        type(node).objects.filter(pk=node.pk).update(acceptance_passed_at=now)
        refresh_health_facts(node, reason="acceptance tests passed", now=now)
    else:
        refresh_health_facts(node, now=now)
    return passed


def edge_events_open(node):
    """Xids and lost GPUs: signals with no end of their own (DESIGN.md's closing rules)."""
    return HealthEvent.objects.open().filter(node=node).filter(
        models.Q(signature__startswith="xid:") | models.Q(signature="gpu_lost"))


def edge_events_a_reboot_settles(node):
    """The edge events a passing check after a reboot closes: all of them, less a lost GPU
    that is still missing from the hellos (accepting the new inventory settles that one)."""
    return edge_events_open(node).exclude(signature="gpu_lost", gpu__missing_since__isnull=False)


def judge_after_reboot(node, *, boot_id, now=None):
    """Once the checks after a reboot have all passed, the Xid and lost-GPU events from
    before that boot close."""
    now = now or timezone.now()
    node.refresh_from_db()
    runs = latest_runs(node, CheckRun.Purpose.AFTER_REBOOT, AFTER_REBOOT_CHECKS,
                       node.booted_at or node.joined_at)
    passed = (node.boot_id == boot_id and all(
        name in runs and runs[name].status == CheckRun.Status.PASSED
        for name in AFTER_REBOOT_CHECKS))
    if passed:
        reason = f"rebooted and passed {', '.join(AFTER_REBOOT_CHECKS)}"
        for event in edge_events_a_reboot_settles(node).filter(first_seen__lt=node.booted_at):
            do_close_health_event(event, reason=reason, now=now)
    refresh_health_facts(node, reason="checks after reboot finished" if passed else "", now=now)
    return passed


def start_checks_after_hello(node, *, rebooted, now=None):
    """What a hello sets off: the acceptance battery for a new or reprovisioned node that
    needs it, and the checks after a reboot of a node with open Xid / lost-GPU events."""
    now = now or timezone.now()
    node.refresh_from_db()
    if node.acceptance_required and (node.acceptance_passed_at is None
                                     or node.acceptance_passed_at < node.joined_at):
        started = CheckRun.objects.filter(node=node, purpose=CheckRun.Purpose.ACCEPTANCE,
                                          requested_at__gte=node.joined_at)
        if not started.exists():
            do_request_checks(node, ACCEPTANCE_CHECKS, purpose=CheckRun.Purpose.ACCEPTANCE,
                              reason="acceptance tests started", now=now)
    if rebooted and edge_events_open(node).filter(severity__in=NODE_AFFECTING).exists():
        do_request_checks(node, AFTER_REBOOT_CHECKS, purpose=CheckRun.Purpose.AFTER_REBOOT,
                          reason="checking the GPUs after the reboot", now=now)
