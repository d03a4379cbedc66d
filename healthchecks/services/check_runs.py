"""Active checks and acceptance: asking a node's agent for runs, their results, and judging
a node after acceptance or a reboot."""

from datetime import datetime, timedelta

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import models, transaction
from django.http import HttpRequest
from django.utils import timezone

from clusters.change_feed import Kind, record_changes
from clusters.services import record_audit
from nodes import agent_work
from nodes.models import Node

from ..check_catalog import AFTER_REBOOT_CHECKS, CHECKS, acceptance_battery, params_for
from ..choices import NODE_AFFECTING, Severity, Source
from ..models import CheckRun, HealthEvent
from .events import do_close_health_event, do_record_health_event
from .facts import latest_runs, refresh_health_facts


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
    announce_run_changes([run])


def announce_run_changes(runs):
    record_changes(Kind.CHECK_RUN, [(run.node.cluster_id, run.node_id, run.pk) for run in runs])


def do_request_check(node: Node, check_name, *, purpose=CheckRun.Purpose.ON_DEMAND,
                     actor: AbstractBaseUser | None = None, request: HttpRequest | None = None,
                     reason="", now: datetime | None = None) -> tuple[CheckRun, bool]:
    """Ask the node's agent to run a check. Returns (run, created) as do_request_checks."""
    [requested] = do_request_checks(node, [check_name], purpose=purpose, actor=actor,
                                    request=request, reason=reason, now=now)
    return requested


@transaction.atomic
def do_request_checks(node: Node, check_names, *, purpose, actor: AbstractBaseUser | None = None,
                      request: HttpRequest | None = None, reason="",
                      now: datetime | None = None) -> list[tuple[CheckRun, bool]]:
    """Ask the node's agent to run checks: one, or a battery it runs one after another.
    Returns [(run, created)], one per name: while the same check is still unfinished on the
    node for the same purpose, that run is returned and no second one starts (a double
    click, two operators). A battery is one lock, one insert and one state refresh: every
    node of a new cluster asks for one as it joins."""
    unknown = [name for name in check_names if name not in CHECKS]
    if unknown:
        raise ValueError(f"unknown check {unknown[0]!r}")
    now = now or timezone.now()
    node = type(node).objects.select_for_update(no_key=True).get(pk=node.pk)
    unfinished = {}
    for run in CheckRun.objects.unfinished().filter(
            node=node, check_name__in=check_names, purpose=purpose).order_by("pk"):
        unfinished.setdefault(run.check_name, run)
    gpu_models = list(node.gpus.in_inventory().values_list("name", flat=True))
    new_runs = [
        CheckRun(node=node, check_name=name, purpose=purpose, requested_by=actor,
                 params=params_for(name, set(gpu_models), len(gpu_models)), requested_at=now,
                 boot_id=node.boot_id, deadline_at=now + timedelta(seconds=CHECKS[name].deadline_s))
        for name in dict.fromkeys(check_names) if name not in unfinished]
    CheckRun.objects.bulk_create(new_runs)
    for run in new_runs:
        if actor is not None:
            record_audit(actor, "checkrun.request", run, cluster=node.cluster, request=request,
                         changes={"node": node.name, "check": run.check_name,
                                  "purpose": purpose}, now=now)
    agent_work.queue_works(CHECK_RUNS, new_runs, now=now)
    announce_run_changes(new_runs)
    # Acceptance and post-reboot runs hold the node.
    if new_runs and purpose != CheckRun.Purpose.ON_DEMAND:
        refresh_health_facts(node, reason=reason, now=now)
    created = {run.check_name: run for run in new_runs}
    requested = []
    for name in check_names:
        if name in created:
            requested.append((created.pop(name), True))
            unfinished[name] = requested[-1][0]
        else:
            requested.append((unfinished[name], False))
    return requested


@transaction.atomic
def do_record_check_result(node: Node, *, run_id, status, metrics=None, message="",
                           now: datetime | None = None) -> CheckRun | None:
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
def do_bulk_request_checks(nodes, check_names, *, purpose, actor: AbstractBaseUser | None = None,
                           request: HttpRequest | None = None) -> list[bool]:
    """The same checks on several nodes (the Nodes list's bulk form), in one transaction: one
    boolean per node, whether every check started (False: some were running already)."""
    return [all(created for _, created in do_request_checks(
        node, check_names, purpose=purpose, actor=actor, request=request)) for node in nodes]


def judge_acceptance(node, now=None):
    """A node whose acceptance battery has all passed since it joined is accepted."""
    now = now or timezone.now()
    node.refresh_from_db()
    battery = acceptance_battery(node.cluster)
    latest = latest_runs(node, CheckRun.Purpose.ACCEPTANCE, battery, node.joined_at)
    passed = all(
        name in latest and latest[name].status == CheckRun.Status.PASSED
        for name in battery
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
            do_request_checks(node, acceptance_battery(node.cluster),
                              purpose=CheckRun.Purpose.ACCEPTANCE,
                              reason="acceptance tests started", now=now)
    if rebooted and edge_events_open(node).filter(severity__in=NODE_AFFECTING).exists():
        do_request_checks(node, AFTER_REBOOT_CHECKS, purpose=CheckRun.Purpose.AFTER_REBOOT,
                          reason="checking the GPUs after the reboot", now=now)
