"""Writes for health events. Opening or closing one refreshes its node's state."""

from datetime import timedelta

from django.db import IntegrityError, models, transaction
from django.db.models import F, Value
from django.db.models.functions import Greatest
from django.utils import timezone

from nodes.states import refresh_node_state

from clusterui.realtime import Throttle
from clusterui.services import record_audit

from .checks import ACCEPTANCE_CHECKS, AFTER_REBOOT_CHECKS, CHECKS, params_for
from .choices import NODE_AFFECTING, Severity, Source
from .models import CheckRun, HealthEvent, Silence


# Open Health checks tabs refresh their table on "health.changed". An Xid storm counts on one
# event thousands of times a second: at most one message a second per cluster (per process).
health_changes = Throttle(interval_s=1.0)


def announce_health_change(node):
    """Once the transaction commits, the open Health checks tabs of the node's cluster hear
    that its health events changed (not at all if it rolls back)."""
    from nodes.publisher import cluster_group  # here: the publisher imports health services

    slug = node.cluster.slug
    transaction.on_commit(
        lambda: health_changes.broadcast(cluster_group(slug), "health.changed", cluster=slug),
        robust=True,  # committed is committed: a channel layer down loses only the live update
    )


@transaction.atomic
def do_record_health_event(
    node, *, signature, severity, message="", gpu=None, evidence=None,
    source=Source.PASSIVE, count=1, now=None,
):
    """Open an event, or raise the count of the open one with the same (node, GPU, signature).

    Safe under concurrency: the database allows one open event per (node, GPU, signature),
    and a signal that loses the race to open it counts on the winner's event.
    """
    now = now or timezone.now()
    announce_health_change(node)
    same = HealthEvent.objects.open().filter(node=node, gpu=gpu, signature=signature)
    changes = {"count": F("count") + count, "last_seen": Greatest("last_seen", Value(now))}
    if message:
        changes["message"] = message
    for _ in range(2):
        if same.update(**changes):
            return same.get()
        try:
            with transaction.atomic():
                event = HealthEvent.objects.create(
                    node=node, gpu=gpu, signature=signature, severity=severity, source=source,
                    message=message, evidence=evidence or {}, first_seen=now, last_seen=now,
                    count=count,
                )
        except IntegrityError:
            continue  # opened a moment ago by another worker: count on that one
        refresh_node_state(node, reason=f"{signature} opened", now=now)
        recommend_repair_after_commit(node)
        return event
    raise RuntimeError(f"cannot record {signature} on {node}: the open event keeps changing")


def recommend_repair_after_commit(node):
    """A new problem on the node: the repairs app looks for a repair to recommend (a task,
    so the agent's frame is acked without waiting for it)."""
    from repairs.tasks import recommend_repair

    node_id = node.pk
    transaction.on_commit(lambda: recommend_repair.delay(node_id), robust=True)


@transaction.atomic
def do_close_health_event(event, *, reason, actor=None, now=None):
    now = now or timezone.now()
    closed = HealthEvent.objects.filter(pk=event.pk, closed_at__isnull=True).update(
        closed_at=now, closed_reason=reason[:255], closed_by=actor
    )
    if closed:
        refresh_node_state(event.node, actor=actor, reason=f"{event.signature} closed: {reason}",
                           now=now)
        announce_health_change(event.node)
    event.refresh_from_db()
    return bool(closed)


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
        announce_health_change(event.node)
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
    refresh_node_state(node, actor=actor, reason=f"{signature} silenced for {hours:g} h", now=now)
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
        refresh_node_state(silence.node, reason=f"silence on {silence.signature} ended", now=now)
    return len(ended)


# Active checks: runs asked of a node's agent, their results, and what follows from them.


def check_signature(check_name):
    """The health event a failing check opens, and a passing one closes."""
    return f"check:{check_name}"


def run_check_frame(run):
    return {"type": "run_check", "run_id": run.pk, "check": run.check_name, "params": run.params}


def offer_run_to_agent(run_id, node_id):
    """Tell the node's agent connection, wherever it is served, that a run waits for it.
    Nothing listens while the agent is offline: its next hello picks the run up."""
    from clusterui.realtime import broadcast
    from nodes.consumers import agent_group

    broadcast(agent_group(node_id), "check.run", run_id=run_id)


@transaction.atomic
def do_request_check(node, check_name, *, purpose=CheckRun.Purpose.ON_DEMAND, actor=None,
                     request=None, now=None):
    """Ask the node's agent to run a check. Returns (run, created): while the same check is
    still unfinished on the node for the same purpose, that run is returned and no second
    one starts (a double click, two operators)."""
    if check_name not in CHECKS:
        raise ValueError(f"unknown check {check_name!r}")
    now = now or timezone.now()
    node = type(node).objects.select_for_update().select_related("cluster").get(pk=node.pk)
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
    transaction.on_commit(lambda: offer_run_to_agent(run.pk, node.pk))
    return run, True


def do_request_checks(node, check_names, *, purpose, actor=None, request=None, now=None):
    """Several checks at once (a battery); the agent runs them one after another.
    Returns [(run, created)] as do_request_check does."""
    return [
        do_request_check(node, name, purpose=purpose, actor=actor, request=request, now=now)
        for name in check_names
    ]


def do_mark_check_sent(node_id, run_id, now=None):
    """The run's run_check frame, marked as handed to the agent's connection; None when the
    run is finished or not this node's."""
    now = now or timezone.now()
    sent = CheckRun.objects.filter(pk=run_id, node_id=node_id, status__in=CheckRun.UNFINISHED)
    if not sent.update(status=CheckRun.Status.RUNNING, sent_at=now):
        return None
    return run_check_frame(sent.get())


def unfinished_run_ids(node_id):
    return list(CheckRun.objects.unfinished().filter(node_id=node_id).order_by("id")
                .values_list("id", flat=True))


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
    if run.purpose == CheckRun.Purpose.ACCEPTANCE:
        judge_acceptance(run.node, now=now)
    elif run.purpose == CheckRun.Purpose.AFTER_REBOOT:
        judge_after_reboot(run.node, boot_id=run.boot_id, now=now)


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
        refresh_node_state(node, reason="acceptance tests passed", now=now)
    else:
        refresh_node_state(node, now=now)
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
    refresh_node_state(node, reason="checks after reboot finished" if passed else "", now=now)
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
                              now=now)
            refresh_node_state(node, reason="acceptance tests started", now=now)
    if rebooted and edge_events_open(node).filter(severity__in=NODE_AFFECTING).exists():
        do_request_checks(node, AFTER_REBOOT_CHECKS, purpose=CheckRun.Purpose.AFTER_REBOOT,
                          now=now)
        refresh_node_state(node, reason="checking the GPUs after the reboot", now=now)


def expire_check_runs(now=None):
    """Runs past their deadline without a result time out. Returns how many."""
    now = now or timezone.now()
    expired = 0
    for run in CheckRun.objects.unfinished().filter(deadline_at__lte=now).select_related("node"):
        with transaction.atomic():
            why = ("no result in time: the agent did not answer" if run.sent_at else
                   "no result in time: the node's agent was not connected")
            done = CheckRun.objects.filter(pk=run.pk, status__in=CheckRun.UNFINISHED).update(
                status=CheckRun.Status.TIMED_OUT, finished_at=now, message=why)
            if done:
                expired += 1
                _after_run_finished(run, now)
    return expired
