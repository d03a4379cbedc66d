"""Running a repair: drain -> act -> wait for the node -> verify -> resume (remove: drain ->
act; clean-up and reconfigure: act -> verify, the node staying in service). Each step is
one short Celery task (repairs.tasks.run_repair_step); a step that has
to wait (jobs to end, the node to boot, a check to finish) says when to look again and the
beat task runs it again then. No task sleeps.

A step may run twice: a worker killed mid-step has its task delivered again (acks_late,
reject_on_worker_lost). So each step first looks at what is already so (the node drained
with our reason, the reboot command already sent) and does only what is missing. It never
runs twice at once: a delivery claims it by a conditional update (claim), and a running
step holds a lease that only a delivery made again after its worker was lost, or the lease
running out, gets past. Any error is tried again with backoff, and then fails the repair
with its reason: no repair stays running for ever.
"""

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.db.models import Exists, F, OuterRef, Q
from django.template.defaultfilters import filesizeformat
from django.http import HttpRequest
from django.utils import timezone

from healthchecks.check_catalog import AFTER_REBOOT_CHECKS
from healthchecks.gpu_lost import do_accept_gpu_inventory
from healthchecks.models import CheckRun, HealthEvent
from healthchecks.services import do_close_health_event, do_request_checks, edge_events_open
from nodes.bundles import do_request_bundle, settle
from nodes.models import AgentCommand, DiagnosticBundle
from nodes.services import (
    REPAIR_OPENER,
    do_issue_join_token,
    do_open_rejoin,
    do_pause_node,
    do_send_command,
)

from clusters.services import record_audit
from schedulers import ExecutorError, RetryLater, scheduler_for

from .announcements import announce_repair_change
from .choices import (
    IN_SERVICE_ACTIONS,
    Action,
    AtDeadline,
    DrainMode,
    Status,
    StepKind,
    StepStatus,
)
from .drain_modes import plan_of
from .models import Repair, RepairSettings, RepairStep
from .providers import CommandProvider, SimulatedProvider
from .services import DUE_EARLY, RepairRefused, due_steps, enqueue_step, settings_for
from .transitions import transition

logger = logging.getLogger(__name__)

RECHECK = timedelta(seconds=5)
JOBS_RECHECK = timedelta(seconds=15)
RETRY_LATER = timedelta(seconds=30)
PROVIDER_TIMEOUT_S = 600
OUTPUT_LIMIT = 16 * 1024


@dataclass(frozen=True)
class Done:
    message: str
    output: str = ""


@dataclass(frozen=True)
class Wait:
    message: str
    after: timedelta = RECHECK
    output: str = ""


@dataclass(frozen=True)
class Failed:
    message: str
    output: str = ""


def drain_reason(repair):
    return f"clusterui repair #{repair.pk}"


def provider_for(cluster):
    settings = settings_for(cluster)
    if settings.provider == RepairSettings.Provider.SIMULATED:
        return SimulatedProvider(reboot_node=lambda name: send_reboot(cluster.nodes.get(name=name)))
    hostnames = dict(cluster.nodes.values_list("name", "hostname"))
    return CommandProvider(settings.provider_commands, timeout_s=PROVIDER_TIMEOUT_S,
                           cluster=cluster.slug,
                           hostname_of=lambda name: hostnames.get(name) or name)


def send_reboot(node):
    return do_send_command(node, AgentCommand.Action.REBOOT)


# How long an in-service repair's verify waits for the signal that called for it to close,
# and what its verify says once it has.
SIGNAL_CLOSES_WITHIN = timedelta(minutes=5)
SIGNAL_GONE = {Action.RECONFIGURE: "Slurm's view of the GPUs matches the hardware",
               Action.CLEANUP: "the agent finds nothing left behind"}


# The steps. Each takes (repair, step, now) and returns Done, Wait or Failed.


def drain(repair, step, now):
    """Take the node out of the scheduler's hands and treat its jobs as the repair's drain
    plan says (repairs.drain_modes): stop them now; or wait for them to end, up to a
    deadline, after a signal for the "signal, then wait" mode. While jobs run the step
    waits, re-checked on the sweeps queue, with the jobs and the deadline in its details
    (the repair's page shows them). At the deadline: stop them, or keep waiting (the
    notifier alerts) until an operator goes on now (do_go_on_now) or aborts."""
    scheduler = scheduler_for(repair.cluster)
    plan = plan_of(repair)
    name = repair.node.name
    output = ""
    if "drained_at" not in step.details:
        output = scheduler.drain(name, drain_reason(repair)) + "\n"
        set_details(step, drained_at=now.isoformat())
    jobs = scheduler.running_jobs(name)
    if not jobs:
        set_details(step, jobs=[])
        return Done(f"drained ({scheduler.name})" if scheduler.drives_nodes
                    else "nothing to drain: no scheduler configured", output)
    ids = ", ".join(job.id for job in jobs)
    deadline = (step.started_at or now) + plan.deadline if plan.waits else None
    past = deadline is not None and now >= deadline
    go_on = step.details.get("go_on")
    if plan.mode == DrainMode.NOW:
        why = "drain mode now"
    elif go_on:
        why = f"{go_on['by']} chose to go on now"
    elif past and (plan.mode == DrainMode.SIGNAL or plan.at_deadline == AtDeadline.GO_ON):
        why = "the deadline passed"
    else:
        why = ""
    set_details(step, jobs=[job_summary(job) for job in jobs],
                deadline=deadline.isoformat() if deadline else None,
                past_deadline=past and not why, stopping=why)
    if why:
        output += scheduler.stop(name, jobs) + "\n"
        return Wait(f"{why}: stopping {len(jobs)} job(s) ({ids}); waiting for them to leave "
                    f"{name}", RECHECK, output)
    signalled = step.details.get("signalled_at")
    if plan.mode == DrainMode.SIGNAL and not signalled:
        output += scheduler.signal(name, jobs, plan.signal, plan.signal_all_steps) + "\n"
        signalled = now.isoformat()
        set_details(step, signalled_at=signalled)
    elif not scheduler.jobs_end_on_their_own:
        # Kubernetes: waiting means evicting as the disruption budgets allow, at each check.
        output += scheduler.signal(name, jobs, plan.signal, plan.signal_all_steps) + "\n"
    until = f"{deadline:%Y-%m-%d %H:%M} UTC"
    if past:
        return Wait(f"past its deadline ({until}): still waiting for {len(jobs)} job(s) "
                    f"({ids}); an operator may go on now or abort", JOBS_RECHECK, output)
    sent = f"sent SIG{plan.signal}; " if plan.mode == DrainMode.SIGNAL and \
        scheduler.jobs_end_on_their_own else ""
    return Wait(f"drained; {sent}waiting for {len(jobs)} job(s) to end ({ids}), until {until}",
                JOBS_RECHECK, output)


def job_summary(job):
    """What the repair's page shows of a job its drain waits for."""
    return {"id": job.id, "user": job.user, "name": job.name, "nodes": list(job.nodes),
            "time_left_s": job.time_left_s}


def collect_bundle(repair, step, now):
    """Ask the node's agent for a diagnostic bundle right before the act, after the drain,
    so it holds the fault's evidence as it is, and wait for it up to the bundle's deadline
    (CLUSTERUI_BUNDLE_DEADLINE_S): one that does not come never holds the repair longer."""
    bundle = repair.bundle
    if bundle is None:
        with transaction.atomic():
            bundle = do_request_bundle(repair.node, now=now,
                                       reason=f"before repair #{repair.pk} ({repair.action})")
            Repair.objects.filter(pk=repair.pk).update(bundle=bundle)
        return Wait(f"asked the agent for a diagnostic bundle (it has {bundle.deadline_s} s)")
    bundle = settle(bundle, now)
    if bundle.status == DiagnosticBundle.Status.STORED:
        return Done(f"diagnostic bundle kept: {filesizeformat(bundle.size_bytes)}, "
                    f"{len(bundle.listing)} files, SHA-256 {bundle.sha256}")
    if bundle.status != DiagnosticBundle.Status.REQUESTED:
        return Done(f"no diagnostic bundle ({bundle.message}); the repair goes on without it")
    return Wait("waiting for the agent's diagnostic bundle")


def act(repair, step, now):
    if repair.action == Action.REBOOT:
        return act_by_agent(repair, step, AgentCommand.Action.REBOOT)
    if repair.action == Action.RECONFIGURE:
        return act_by_agent(repair, step, AgentCommand.Action.RECONFIGURE)
    if repair.action == Action.CLEANUP:
        return act_by_agent(repair, step, AgentCommand.Action.CLEANUP)
    if repair.action == Action.RESET_GPU:
        return act_by_agent(repair, step, AgentCommand.Action.RESET_GPU,
                            params={"gpu_uuid": repair.gpu.uuid})
    if "provider_done" in step.details:
        return Done(f"{repair.action} done by the provider")
    if "provider_started" in step.details:
        # The worker stopped while the provider ran: whether it acted is unknown, and a
        # reprovision or removal must not run twice on a guess.
        return Failed(f"the provider's {repair.action} was interrupted (its worker stopped); "
                      f"check the node, then propose the repair again")
    set_details(step, provider_started=now.isoformat())
    join_token = None
    if repair.action in (Action.REPROVISION, Action.FAILOVER):
        join_token = open_for_rejoin(repair, now)
    output = provider_for(repair.cluster).run(repair.action, repair.node.name,
                                              join_token=join_token)
    set_details(step, provider_done=now.isoformat())
    if repair.action == Action.REMOVE:
        do_pause_node(repair.node, actor=None,
                      reason=f"removed from the pool for RMA (repair #{repair.pk})")
    return Done(f"{repair.action} started by the provider", output)


def open_for_rejoin(repair, now):
    """A reprovisioned or replacement machine comes back with a join token: the node is open
    to re-join until the repair ends (repairs.transitions closes it), and the provider gets
    a single-use join token that re-joins only this node. Returns its plaintext."""
    timeout = timedelta(seconds=PROVIDER_TIMEOUT_S + settings_for(repair.cluster).boot_timeout_s)
    by = REPAIR_OPENER.format(repair.pk)
    do_open_rejoin(repair.node, by=by, until=now + timeout, now=now)
    _, plaintext = do_issue_join_token(repair.cluster, single_use=True, for_node=repair.node,
                                       expires_at=now + timeout, note=f"{by} ({repair.action})",
                                       now=now)
    return plaintext


def act_by_agent(repair, step, action, params=None):
    """The agent's command for the action, sent once. A reboot is under way once accepted
    (the wait step sees it done); a clean-up or a reconfigure is done when the agent says
    ok."""
    command_id = step.details.get("command_id")
    if command_id is None:
        with transaction.atomic():
            command = do_send_command(repair.node, action, params=params)
            set_details(step, command_id=command.pk)
        return Wait(f"{action} command #{command.pk} sent to the agent")
    command = AgentCommand.objects.get(pk=command_id)
    done = ("accepted", "ok") if action == AgentCommand.Action.REBOOT else ("ok",)
    if command.status in done:
        verb = "accepted" if command.status == "accepted" else "carried out"
        return Done(f"the agent {verb} {action} command #{command.pk}", command.message)
    if command.status in ("failed", "timed_out"):
        return Failed(f"{action} command #{command.pk} {command.get_status_display()}: "
                      f"{command.message}")
    return Wait(f"{action} command #{command.pk} is {command.get_status_display()}")


def wait_for_node(repair, step, now):
    node = repair.node
    node.refresh_from_db()
    if node.boot_id and node.boot_id != repair.boot_id_before:
        return Done(f"back with a new boot id ({node.boot_id[:8]}…)")
    timeout = timedelta(seconds=settings_for(repair.cluster).boot_timeout_s)
    if now > (step.started_at or now) + timeout:
        return Failed(f"the node did not come back within {timeout.total_seconds() / 60:g} min")
    return Wait("waiting for the node to say hello with a new boot id")


def verify(repair, step, now):
    if repair.action in IN_SERVICE_ACTIONS:
        return verify_signal_closed(repair, step, now)
    node = repair.node
    node.refresh_from_db()
    runs = CheckRun.objects.filter(pk__in=step.details.get("runs", [])).order_by("pk")
    if not runs.exists():
        requested = checks_to_verify(repair, node, now)
        set_details(step, runs=[requested[name].pk for name in AFTER_REBOOT_CHECKS])
        return Wait(f"running {', '.join(AFTER_REBOOT_CHECKS)}")
    runs = list(runs)
    if any(not run.is_finished for run in runs):
        waiting = [run.check_name for run in runs if not run.is_finished]
        return Wait(f"waiting for {', '.join(waiting)}")
    failed = [run for run in runs if run.status != CheckRun.Status.PASSED]
    if failed:
        return Failed("; ".join(f"{run.check_name} {run.get_status_display()}: {run.message}"
                                for run in failed))
    if repair.action == Action.RESET_GPU:
        closed = close_what_the_reset_settled(repair, now)
        return Done(f"passed {', '.join(run.check_name for run in runs)}"
                    + (f"; closed {closed}" if closed else ""))
    # A replaced GPU joins the inventory here (DESIGN.md: the verify step accepts it).
    do_accept_gpu_inventory(node, actor=None)
    return Done(f"passed {', '.join(run.check_name for run in runs)}")


def checks_to_verify(repair, node, now):
    """{check name: CheckRun} of the checks after the repair: after a reboot, those the new
    boot already started (start_checks_after_hello) and the missing ones; after a GPU
    reset, new ones (the boot is the same as before it)."""
    if repair.action == Action.RESET_GPU:
        return {run.check_name: run for run, _ in do_request_checks(
            node, AFTER_REBOOT_CHECKS, purpose=CheckRun.Purpose.AFTER_RESET, now=now)}
    existing = CheckRun.objects.filter(node=node, purpose=CheckRun.Purpose.AFTER_REBOOT,
                                       boot_id=node.boot_id, check_name__in=AFTER_REBOOT_CHECKS)
    requested = {run.check_name: run for run in existing}
    missing = [name for name in AFTER_REBOOT_CHECKS if name not in requested]
    for run, _ in do_request_checks(node, missing, purpose=CheckRun.Purpose.AFTER_REBOOT,
                                    now=now):
        requested[run.check_name] = run
    return requested


def close_what_the_reset_settled(repair, now):
    """After a GPU reset and passing checks, the edge events (Xids) of that GPU from before
    the reset close, as a reboot's do for the whole node. Returns their signatures."""
    act = repair.steps.get(kind=StepKind.ACT)
    settled = edge_events_open(repair.node).filter(gpu=repair.gpu,
                                                   first_seen__lt=act.finished_at)
    signatures = []
    for event in settled:
        do_close_health_event(event, reason=f"GPU reset by repair #{repair.pk} and checked",
                              now=now)
        signatures.append(event.signature)
    return ", ".join(sorted(set(signatures)))


def verify_signal_closed(repair, step, now):
    """After a clean-up or a reconfigure the agent looks again (its zombie and leftover
    scans, NVML against Slurm's view) and closes the signal once it is gone. A repair
    proposed by hand, for no signal, is done once the agent has acted."""
    still = HealthEvent.objects.open().filter(node=repair.node,
                                              signature=repair.signature).first()
    if still is None:
        return Done(SIGNAL_GONE[repair.action])
    if now > (step.started_at or now) + SIGNAL_CLOSES_WITHIN:
        return Failed(f"{repair.signature} is still open {SIGNAL_CLOSES_WITHIN.seconds // 60} "
                      f"min after the {repair.action}: {still.message}")
    return Wait(f"waiting for the agent to see {repair.signature} gone")


def resume(repair, step, now):
    scheduler = scheduler_for(repair.cluster)
    name = repair.node.name
    state = scheduler.node(name)
    if state.drained and state.reason and state.reason != drain_reason(repair):
        return Done(f"left drained: its drain reason is not this repair's ({state.reason})")
    output = scheduler.resume(name) if state.drained else ""
    return Done(f"resumed ({scheduler.name})" if scheduler.drives_nodes
                else "nothing to resume: no scheduler configured", output)


STEP_FUNCTIONS = {
    StepKind.DRAIN: drain,
    StepKind.COLLECT_BUNDLE: collect_bundle,
    StepKind.ACT: act,
    StepKind.WAIT_FOR_NODE: wait_for_node,
    StepKind.VERIFY: verify,
    StepKind.RESUME: resume,
}


def set_details(step, **values):
    """Record what a step has done, at once and on its own, before anything that could fail
    after it: a second run reads it."""
    step.details = {**step.details, **values}
    RepairStep.objects.filter(pk=step.pk).update(details=step.details)


def lease_for(step):
    """How long a step may run before another delivery may take it over: longer than its
    work can take (a provider command has PROVIDER_TIMEOUT_S), so a running step is never
    run twice at once; a worker that died leaves it for this long at most."""
    return timedelta(seconds=PROVIDER_TIMEOUT_S + 60 if step.kind == StepKind.ACT else 120)


def claim(step_id, now, holder):
    """Take the step for one run, by a conditional update that one delivery wins: it must be
    pending, waiting and due, or running under a lease that expired or is `holder`'s own (a
    delivery made again after its worker was lost). The step, or None."""
    step = (RepairStep.objects.filter(pk=step_id)
            .select_related("repair__node__cluster", "repair__cluster").first())
    if step is None:
        return None
    # The conditions are on the step's own row, not through a join: PostgreSQL checks them
    # again on the row another delivery has just changed, which a join's subquery escapes.
    repair_running = Exists(Repair.objects.filter(pk=OuterRef("repair_id"),
                                                  status=Status.RUNNING))
    claimable = RepairStep.objects.filter(repair_running, pk=step_id).filter(
        Q(status=StepStatus.PENDING)
        | Q(status=StepStatus.WAITING, next_check_at__lte=now + DUE_EARLY)
        | Q(status=StepStatus.RUNNING, lease_until__lte=now)
        | Q(status=StepStatus.RUNNING, lease_holder=holder))
    started_at = step.started_at or now
    taken = claimable.update(status=StepStatus.RUNNING, attempts=F("attempts") + 1,
                             started_at=started_at, lease_holder=holder[:64],
                             lease_until=now + lease_for(step))
    if not taken:
        return None
    step.refresh_from_db()
    return step


# A step that raises anything else than ExecutorError (the database, Redis, a bug) is tried
# again after 5, 10, 20, 40 s, and then fails its repair with the error.
ERROR_RETRIES = 4
ERROR_BACKOFF = timedelta(seconds=5)


def run_step(step_id, now=None, holder=""):
    """Run one step once; record how it went; start the next step or end the repair.
    `holder`: the delivery (its Celery task id); a run without one is its own."""
    now = now or timezone.now()
    step = claim(step_id, now, holder or f"run-{uuid.uuid4()}")
    if step is None:
        return None
    repair = step.repair
    try:
        outcome = STEP_FUNCTIONS[step.kind](repair, step, now)
    except RetryLater as exc:
        outcome = Wait(str(exc), RETRY_LATER)
    except ExecutorError as exc:
        outcome = Failed(str(exc))
    except Exception as exc:  # noqa: BLE001 - any error is retried, then fails the repair
        logger.exception("step %s of repair #%s raised", step.kind, repair.pk)
        outcome = after_error(step, exc)
    else:
        if step.details.get("errors"):
            set_details(step, errors=0)
    record_outcome(step, outcome, timezone.now())
    return outcome


def after_error(step, exc):
    """Wait and try again, or, after ERROR_RETRIES, fail: what a step that raised does."""
    errors = step.details.get("errors", 0) + 1
    set_details(step, errors=errors)
    what = f"{type(exc).__name__}: {exc}"[:300]
    if errors > ERROR_RETRIES:
        return Failed(f"error {errors} times in a row, the last: {what}")
    after = ERROR_BACKOFF * 2 ** (errors - 1)
    return Wait(f"error ({what}); trying again in {after.total_seconds():g} s "
                f"({errors} of {ERROR_RETRIES})", after)


@transaction.atomic
def record_outcome(step, outcome, now):
    repair = Repair.objects.select_for_update().get(pk=step.repair_id)
    output = (step.output + outcome.output)[-OUTPUT_LIMIT:]
    released = {"lease_holder": "", "lease_until": None}
    if isinstance(outcome, Wait):
        RepairStep.objects.filter(pk=step.pk).update(
            status=StepStatus.WAITING, message=outcome.message[:500], output=output,
            next_check_at=now + outcome.after, **released)
        announce_repair_change(repair)
        return
    status = StepStatus.DONE if isinstance(outcome, Done) else StepStatus.FAILED
    RepairStep.objects.filter(pk=step.pk).update(
        status=status, message=outcome.message[:500], output=output, finished_at=now,
        next_check_at=None, **released)
    if repair.status != Status.RUNNING:
        # Aborted while this step ran: what it did is recorded, and nothing follows.
        announce_repair_change(repair)
        return
    if isinstance(outcome, Failed):
        fail_repair(repair, f"{step.get_kind_display()} failed: {outcome.message}", now, step)
        return
    following = repair.steps.filter(position__gt=step.position).order_by("position").first()
    if following is not None:
        enqueue_step(following.pk)
        announce_repair_change(repair)
        return
    transition(repair, Status.SUCCEEDED, reason="every step done", now=now, finished_at=now,
               outcome=SUCCESS_OUTCOMES.get(repair.action, outcome.message))


SUCCESS_OUTCOMES = {
    Action.CLEANUP: "repaired: the leftovers ended, and the signal closed",
    Action.RECONFIGURE: "repaired: Slurm's GPU view rebuilt from the hardware, and verified",
    Action.RESET_GPU: "repaired: drained, GPU reset, verified and resumed",
    Action.REBOOT: "repaired: drained, acted, back, verified and resumed",
    Action.REPROVISION: "repaired: drained, acted, back, verified and resumed",
    Action.FAILOVER: "repaired: drained, acted, back, verified and resumed",
}


def fail_repair(repair, why, now, step=None):
    """The repair fails with its reason; the node stays out of service (paused), unless the
    repair left it in service, or it was a GPU reset that the agent did not carry out
    (refused by the topology, or a process holds the GPU): nothing was done to the node, so
    its drain is lifted and the next rung of the ladder (a reboot) is proposed at once."""
    transition(repair, Status.FAILED, reason=why, now=now, finished_at=now, outcome=why)
    if repair.action in IN_SERVICE_ACTIONS:
        return
    if repair.action == Action.RESET_GPU and step is not None and step.kind == StepKind.ACT:
        try:
            lift_drain(repair)
        except ExecutorError:
            logger.exception("lifting the drain of repair #%s failed", repair.pk)
        return
    do_pause_node(repair.node, actor=None, reason=f"repair #{repair.pk} failed: {why}"[:255],
                  now=now)


def do_abort_repair(repair, *, actor: AbstractBaseUser, comment, resume_node,
                    request: HttpRequest | None = None,
                    now: datetime | None = None) -> tuple[Repair, str]:
    """An operator stops a running repair, saying why (DESIGN.md: aborted). No step runs
    after it; one running at that moment finishes and is recorded, and nothing follows it.
    The node then stays out of service, paused with the comment, or (resume_node) goes
    back: the drain this repair put on it in the scheduler is lifted. Returns (repair, what
    happened to the node). Raises Conflict (not running any more) or RepairRefused."""
    if not comment.strip():
        raise RepairRefused("Say why the repair is aborted.")
    now = now or timezone.now()
    after = "resumed" if resume_node else "kept paused"
    with transaction.atomic():
        repair = transition(repair, Status.ABORTED, actor=actor, reason=comment, now=now,
                            finished_at=now, outcome=f"aborted by {actor.get_username()}: "
                                                     f"{comment} (node {after})")
        RepairStep.objects.filter(repair=repair).exclude(
            status__in=[StepStatus.DONE, StepStatus.FAILED]).update(next_check_at=None)
        record_audit(actor, "repair.abort", repair, cluster=repair.cluster, request=request,
                     changes={"comment": comment, "node": after}, now=now)
        if not resume_node:
            do_pause_node(repair.node, actor=actor, request=request, now=now,
                          reason=f"repair #{repair.pk} aborted: {comment}"[:200])
            return repair, f"{repair.node.name} stays paused."
    try:
        return repair, lift_drain(repair)
    except ExecutorError as exc:
        do_pause_node(repair.node, actor=None, now=now,
                      reason=f"repair #{repair.pk} aborted; its drain could not be lifted: "
                             f"{exc}"[:255])
        return repair, f"{repair.node.name} could not be resumed in its scheduler ({exc}): " \
                       f"it is paused."


def do_go_on_now(repair, *, actor: AbstractBaseUser, comment,
                 request: HttpRequest | None = None, now: datetime | None = None) -> Repair:
    """An operator ends the wait of a running repair's drain, saying why: its jobs are
    stopped now (requeued or cancelled; pods evicted, or deleted where a budget refuses) and
    the repair goes on. Raises RepairRefused when its drain is not waiting for jobs."""
    if not comment.strip():
        raise RepairRefused("Say why the jobs are stopped now.")
    now = now or timezone.now()
    with transaction.atomic():
        step = (RepairStep.objects.select_for_update()
                .filter(repair=repair, kind=StepKind.DRAIN, repair__status=Status.RUNNING,
                        status__in=[StepStatus.WAITING, StepStatus.RUNNING]).first())
        if step is None or not step.details.get("jobs"):
            raise RepairRefused(f"repair #{repair.pk} is not waiting for jobs")
        if step.details.get("go_on") or step.details.get("stopping"):
            raise RepairRefused(f"repair #{repair.pk} already stops its jobs")
        set_details(step, go_on={"by": actor.get_username(), "at": now.isoformat(),
                                 "comment": comment})
        RepairStep.objects.filter(pk=step.pk, status=StepStatus.WAITING).update(next_check_at=now)
        record_audit(actor, "repair.go_on_now", repair, cluster=repair.cluster, request=request,
                     changes={"comment": comment,
                              "jobs": [job["id"] for job in step.details["jobs"]]}, now=now)
        if step.status == StepStatus.WAITING:
            enqueue_step(step.pk)
        announce_repair_change(repair)
    return repair


def lift_drain(repair):
    """Resume the node in its scheduler if this repair's drain is still on it (a Kubernetes
    node still cordoned by it, its pods not all gone, counts)."""
    scheduler = scheduler_for(repair.cluster)
    name = repair.node.name
    state = scheduler.node(name)
    if state.reason != drain_reason(repair):
        return f"{name} is back in service."
    scheduler.resume(name)
    return f"{name} is back in service ({scheduler.name} drain lifted)."


def run_due_steps(now=None):
    """Beat: enqueue the waiting steps whose next check has come."""
    due = due_steps(now)
    for step_id in due:
        with transaction.atomic():
            enqueue_step(step_id)
    return len(due)
