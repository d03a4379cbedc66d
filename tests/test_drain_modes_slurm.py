"""Each drain mode against real Slurm (tests/slurm.py: slurmctld, slurmdbd and the slurmds of
gpu-001..gpu-004): the repair's steps run in this process, one at a time, as a worker would
run them (repairs.steps.run_step); the act step is seen as the reboot command it sends the
node's agent. repairs/tests/test_drain_modes.py has the plans and Kubernetes."""

from datetime import timedelta

import pytest
from django.utils import timezone

from clusters.models import AuditEntry, Cluster
from nodes.models import AgentCommand
from nodes.services import do_record_hello, do_register_node
from repairs import steps
from repairs.choices import StepStatus
from repairs.models import RepairPolicy
from repairs.services import do_approve_repair, do_propose_repair
from schedulers.slurm import parse_node_line

from repairs.tests.helpers import past_the_bundle

from .slurm import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


@pytest.fixture
def enqueued(monkeypatch):
    """Step ids enqueued, in order, instead of Celery."""
    ids = []
    monkeypatch.setattr("repairs.services.enqueue_step", ids.append)
    monkeypatch.setattr("repairs.steps.enqueue_step", ids.append)
    return ids


@pytest.fixture
def slurm_cluster_of_the_console(cluster, slurm):
    Cluster.objects.filter(pk=cluster.pk).update(scheduler="slurm",
                                                 scheduler_config=str(slurm.slurm_conf))
    cluster.refresh_from_db()
    return cluster


def console_node(cluster, name):
    node = do_register_node(cluster, name)
    do_record_hello(node, boot_id="boot-1")
    return node


def approve(node, operator, enqueued, drain_mode=None):
    """Propose and approve a reboot of the node; the id of its drain step."""
    repair = do_propose_repair(node, action="reboot", actor=operator, reason="flaky NVLink")
    repair = do_approve_repair(repair, actor=operator, drain_mode=drain_mode)
    return repair, enqueued.pop(0)


def rebooted(node):
    return AgentCommand.objects.filter(node=node, action="reboot").exists()


def run_until_done(step_id, enqueued, now=None, timeout=30):
    """Run the drain step until it is done (the jobs left), then the act step. Each run is
    at its next check (a sweep later than `now`, or than the clock)."""
    def done():
        at = (now or timezone.now()) + steps.JOBS_RECHECK
        return isinstance(steps.run_step(step_id, now=at), steps.Done)
    wait_for(done, timeout=timeout, what="the drain step done", interval=0.5)
    past_the_bundle(enqueued)  # no agent here: the repair goes on without a bundle
    steps.run_step(enqueued.pop(0))


def slurm_node(slurm, name):
    return parse_node_line(slurm.run(["scontrol", "show", "node", name, "-o"]).stdout)


def test_now_requeues_the_requeueable_job_and_cancels_the_other_before_the_reboot(
        slurm, slurm_cluster_of_the_console, operator, enqueued):
    node = console_node(slurm_cluster_of_the_console, "gpu-001")
    requeueable = slurm.sbatch("sleep 600", nodelist="gpu-001", name="train")
    pinned = slurm.sbatch("sleep 600", nodelist="gpu-001", name="eval",
                          extra=["--no-requeue"])
    for job in (requeueable, pinned):
        slurm.wait_job_state(job, "RUNNING")
    repair, drain_id = approve(node, operator, enqueued, drain_mode="now")

    waited = steps.run_step(drain_id)

    assert waited.message.startswith("drain mode now: stopping 2 job(s)")
    assert not rebooted(node)
    slurm.wait_job_state(pinned, "CANCELLED")
    # Requeued: pending again (it may only run on gpu-001, which is drained).
    slurm.wait_job_state(requeueable, "PENDING")
    step = repair.steps.get(pk=drain_id)
    assert f"requeued {requeueable}" in step.output
    assert f"cancelled {pinned} (submitted with --no-requeue: Slurm cannot requeue it)" \
        in step.output
    run_until_done(drain_id, enqueued)
    assert rebooted(node)


def test_after_the_jobs_end_the_act_waits_for_the_job_and_starts_within_a_sweep_of_its_end(
        slurm, slurm_cluster_of_the_console, operator, enqueued):
    node = console_node(slurm_cluster_of_the_console, "gpu-001")
    job = slurm.sbatch("sleep 8", nodelist="gpu-001", name="short")
    slurm.wait_job_state(job, "RUNNING")
    repair, drain_id = approve(node, operator, enqueued)  # a proposal's default: after_jobs

    waited = steps.run_step(drain_id)

    assert waited.message.startswith(f"drained; waiting for 1 job(s) to end ({job}), until ")
    assert waited.after == steps.JOBS_RECHECK  # the next look: one sweep later
    assert slurm_node(slurm, "gpu-001")["State"] == "MIXED+DRAIN"
    step = repair.steps.get(pk=drain_id)
    assert step.status == StepStatus.WAITING and step.waiting_for_jobs[0]["id"] == job
    assert slurm.job_state(job) == "RUNNING" and not rebooted(node)

    slurm.wait_job_state(job, "COMPLETED", timeout=30)
    run_until_done(drain_id, enqueued, timeout=5)
    assert rebooted(node)


def test_after_the_jobs_end_goes_on_as_the_policy_says_once_its_deadline_passes(
        slurm, slurm_cluster_of_the_console, operator, admin, enqueued):
    cluster = slurm_cluster_of_the_console
    RepairPolicy.objects.create(cluster=cluster, signature="manual", drain_mode="after_jobs",
                                drain_deadline_s=60, drain_at_deadline="go_on",
                                updated_by=admin)
    node = console_node(cluster, "gpu-002")
    job = slurm.sbatch("sleep 600", nodelist="gpu-002", name="long")
    slurm.wait_job_state(job, "RUNNING")
    repair, drain_id = approve(node, operator, enqueued)
    t0 = timezone.now()

    steps.run_step(drain_id, now=t0)
    steps.run_step(drain_id, now=t0 + timedelta(seconds=30))
    assert slurm.job_state(job) == "RUNNING"

    waited = steps.run_step(drain_id, now=t0 + timedelta(seconds=61))
    assert waited.message.startswith("the deadline passed: stopping 1 job(s)")
    slurm.wait_job_state(job, "PENDING")
    run_until_done(drain_id, enqueued, now=t0 + timedelta(seconds=62))
    assert rebooted(node)


def test_signal_then_wait_lets_a_job_checkpoint_and_then_reboots(
        slurm, slurm_cluster_of_the_console, operator, enqueued):
    node = console_node(slurm_cluster_of_the_console, "gpu-003")
    checkpoint = slurm.jobs_dir / "checkpoint-of-the-trapping-job"
    # The batch shell traps USR1, saves, and ends: what a checkpointing job does.
    job = slurm.sbatch(f"trap 'echo step 1200 > {checkpoint}; exit 0' USR1; sleep 600 & wait",
                       nodelist="gpu-003", name="ckpt")
    slurm.wait_job_state(job, "RUNNING")
    repair, drain_id = approve(node, operator, enqueued, drain_mode="signal")

    waited = steps.run_step(drain_id)

    assert waited.message.startswith("drained; sent SIGUSR1; waiting for 1 job(s)")
    step = repair.steps.get(pk=drain_id)
    assert f"sent SIGUSR1 to the batch shell of {job}" in step.output
    wait_for(checkpoint.exists, timeout=15, what="the job's checkpoint file")
    assert checkpoint.read_text() == "step 1200\n"
    assert not rebooted(node)
    slurm.wait_job_state(job, "COMPLETED", timeout=15)
    run_until_done(drain_id, enqueued, timeout=5)
    assert rebooted(node)
    # Signalled once: the later checks did not signal again.
    assert repair.steps.get(pk=drain_id).output.count("sent SIGUSR1") == 1


def waiting_for_a_long_job(slurm, cluster, operator, enqueued):
    """A reboot of gpu-004 whose drain (after the jobs end) waits for a 10-minute job:
    (node, repair, its drain step's id, the job)."""
    node = console_node(cluster, "gpu-004")
    job = slurm.sbatch("sleep 600", nodelist="gpu-004", name="long")
    slurm.wait_job_state(job, "RUNNING")
    repair, drain_id = approve(node, operator, enqueued)
    steps.run_step(drain_id)
    assert slurm_node(slurm, "gpu-004")["State"] == "MIXED+DRAIN"
    return node, repair, drain_id, job


def test_an_operator_goes_on_now_while_the_drain_waits_and_it_is_audited(
        slurm, slurm_cluster_of_the_console, operator, enqueued):
    node, repair, drain_id, job = waiting_for_a_long_job(slurm, slurm_cluster_of_the_console,
                                                         operator, enqueued)

    steps.do_go_on_now(repair, actor=operator, comment="the job hangs; requeue it")

    assert enqueued == [drain_id]
    steps.run_step(enqueued.pop(0))
    slurm.wait_job_state(job, "PENDING")
    assert AuditEntry.objects.get(action="repair.go_on_now").changes["jobs"] == [job]
    run_until_done(drain_id, enqueued)
    assert rebooted(node)


def test_an_operator_aborts_while_the_drain_waits_and_the_node_and_job_go_on(
        slurm, slurm_cluster_of_the_console, operator, enqueued):
    node, repair, drain_id, job = waiting_for_a_long_job(slurm, slurm_cluster_of_the_console,
                                                         operator, enqueued)

    repair, said = steps.do_abort_repair(repair, actor=operator, comment="not now",
                                         resume_node=True)

    assert said == "gpu-004 is back in service (slurm drain lifted)."
    state = slurm_node(slurm, "gpu-004")["State"].split("+")
    assert state[0] == "MIXED" and "DRAIN" not in state
    assert slurm.job_state(job) == "RUNNING" and not rebooted(node)
    assert AuditEntry.objects.get(action="repair.abort").changes["node"] == "resumed"
    assert steps.run_step(drain_id) is None  # nothing runs after an abort
