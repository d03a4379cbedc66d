"""SlurmScheduler against a real Slurm cluster (tests/slurm.py: slurmctld, slurmdbd and four
slurmds with 8 fake GPUs each): drain, resume, a node's state, its running jobs, requeue,
and the errors an operator sees."""

import subprocess
import time

import pytest

from schedulers import ExecutorError, SchedulerNode
from schedulers.slurm import SlurmScheduler

from .slurm import wait_for

pytestmark = pytest.mark.integration


class CountingScheduler(SlurmScheduler):
    """A SlurmScheduler that records the commands it ran."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.commands = []

    def _run(self, *argv):
        self.commands.append(" ".join(argv))
        return super()._run(*argv)

    def updates(self):
        return [c for c in self.commands if c.startswith("scontrol update")]


@pytest.fixture
def scheduler(slurm):
    return CountingScheduler(slurm_conf=slurm.slurm_conf, timeout_s=15)


def test_it_drains_an_idle_node_and_reads_it_back(slurm, scheduler):
    scheduler.drain("gpu-002", "clusterui repair #1")

    assert scheduler.node("gpu-002") == SchedulerNode(
        state="IDLE+DRAIN", drained=True, reason="clusterui repair #1")
    assert slurm.node_states()["gpu-002"] == "drain"
    assert scheduler.node("gpu-001") == SchedulerNode(state="IDLE", drained=False)


def test_draining_twice_with_the_same_reason_changes_nothing(slurm, scheduler):
    scheduler.drain("gpu-002", "clusterui repair #2")
    output = scheduler.drain("gpu-002", "clusterui repair #2")

    assert output == "gpu-002 already drained: clusterui repair #2"
    assert scheduler.updates() == [
        "scontrol update nodename=gpu-002 state=drain reason=clusterui repair #2"]

    scheduler.drain("gpu-002", "clusterui repair #3")

    assert len(scheduler.updates()) == 2
    assert scheduler.node("gpu-002").reason == "clusterui repair #3"


def test_a_drained_node_with_running_jobs_is_mixed_drain_and_lists_them(slurm, scheduler):
    slurm.add_user("alice", "research")
    slurm.add_user("bob", "ops")
    alice_job = slurm.sbatch("sleep 300", user="alice", gres="gpu:2", nodelist="gpu-003",
                             name="train llama|7b")
    bob_job = slurm.sbatch("sleep 300", user="bob", gpus=3, nodelist="gpu-003")
    slurm.wait_job_state(alice_job, "RUNNING")
    slurm.wait_job_state(bob_job, "RUNNING")

    scheduler.drain("gpu-003", "clusterui repair #4")

    node = scheduler.node("gpu-003")
    assert (node.state, node.drained) == ("MIXED+DRAIN", True)
    jobs = {job.id: job for job in scheduler.running_jobs("gpu-003")}
    assert set(jobs) == {alice_job, bob_job}
    assert (jobs[alice_job].user, jobs[alice_job].name, jobs[alice_job].gpus) == (
        "alice", "train llama|7b", 2)
    assert (jobs[bob_job].user, jobs[bob_job].name, jobs[bob_job].gpus) == ("bob", "wrap", 3)
    assert all(0 <= job.run_time_s < 60 for job in jobs.values())
    # Draining lets the jobs run on.
    assert slurm.job_state(alice_job) == "RUNNING"
    assert scheduler.running_jobs("gpu-004") == []


def test_a_requeued_job_is_pending_and_starts_again_elsewhere_at_once(slurm, scheduler):
    job = slurm.sbatch("sleep 300", gres="gpu:1")
    slurm.wait_job_state(job, "RUNNING")
    first_node = slurm.job_node(job)
    scheduler.drain(first_node, "clusterui repair #5")
    requeued_at = time.monotonic()

    scheduler.requeue([job])

    assert slurm.job_state(job) in {"PENDING", "CONFIGURING", "RUNNING"}
    slurm.wait_job_state(job, "RUNNING", timeout=30)
    # Slurm's own delay after a requeue is about 121 s; StartTime=now skips it.
    assert time.monotonic() - requeued_at < 30
    assert slurm.job_node(job) not in {"", first_node}
    assert [j.id for j in scheduler.running_jobs(first_node)] == []


def test_a_job_slow_to_stop_is_requeued_and_starts_now_when_asked_again(slurm):
    # It ignores SIGTERM: Slurm kills it KillWait (2 s) later, longer than the time limit.
    job = slurm.sbatch("trap '' TERM; sleep 300")
    slurm.wait_job_state(job, "RUNNING")
    first_node = slurm.job_node(job)
    scheduler = CountingScheduler(slurm_conf=slurm.slurm_conf, timeout_s=1)
    scheduler.drain(first_node, "clusterui repair #8")

    output = scheduler.requeue([job])

    assert output == (f"requeued {job}; pending to start now: none; still completing after "
                      f"1 s: {job} (requeue them again to start them now)")
    slurm.wait_job_state(job, "PENDING", timeout=10)
    time.sleep(1)
    assert slurm.job_state(job) == "PENDING"  # Slurm's own delay holds it back

    assert scheduler.requeue([job]) == f"requeued none; pending to start now: {job}"
    slurm.wait_job_state(job, "RUNNING", timeout=15)
    assert slurm.job_node(job) not in {"", first_node}


def test_requeue_leaves_a_finished_job_finished(slurm, scheduler):
    job = slurm.sbatch("true")
    slurm.wait_job_state(job, "COMPLETED")

    output = scheduler.requeue([job])

    assert output == "requeued none; pending to start now: none"
    assert [c for c in scheduler.commands if c.startswith("scontrol")] == []
    assert slurm.job_state(job) == "COMPLETED"
    assert scheduler.requeue([]) == "no jobs to requeue"


def test_an_interactive_job_cannot_be_requeued_and_says_why(slurm, scheduler):
    srun = subprocess.Popen(["srun", "-w", "gpu-004", "--gpus=1", "-J", "shell", "sleep", "300"],
                            env=slurm.env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        jobs = wait_for(lambda: scheduler.running_jobs("gpu-004"), timeout=15,
                        what="the srun job runs")
        assert [(j.name, j.gpus) for j in jobs] == [("shell", 1)]

        with pytest.raises(ExecutorError) as error:
            scheduler.requeue([jobs[0].id])

        assert str(error.value) == (
            f"scontrol requeue {jobs[0].id} exited with status 1: "
            f"Only batch jobs are accepted or processed for job {jobs[0].id}")
    finally:
        slurm.cancel_all_jobs()
        srun.wait(timeout=15)


def test_resume_returns_a_drained_node_to_idle_and_is_idempotent(slurm, scheduler):
    scheduler.drain("gpu-001", "clusterui repair #6")

    assert scheduler.resume("gpu-001") == "resumed gpu-001 (was IDLE+DRAIN)"

    # Right after a resume Slurm shows IDLE+NOT_RESPONDING for a moment.
    wait_for(lambda: scheduler.node("gpu-001").state == "IDLE", timeout=10,
             what="gpu-001 idle")
    assert scheduler.node("gpu-001") == SchedulerNode(state="IDLE", drained=False)
    assert scheduler.resume("gpu-001") == "gpu-001 already in service (IDLE)"
    assert len(scheduler.updates()) == 2


def test_an_unknown_node_raises_executor_error_with_slurms_message(slurm, scheduler):
    with pytest.raises(ExecutorError) as error:
        scheduler.drain("gpu-999", "clusterui repair #7")

    assert str(error.value) == (
        "scontrol show node gpu-999 -o exited with status 1: Node gpu-999 not found")
    assert scheduler.updates() == []


def test_a_controller_that_does_not_answer_raises_after_the_time_limit(slurm, tmp_path):
    # The cluster's own configuration with slurmctld's port moved to where nothing listens.
    conf = slurm.slurm_conf.read_text().replace(
        f"SlurmctldPort={slurm.ports['slurmctld']}", "SlurmctldPort=1")
    (tmp_path / "slurm.conf").write_text(conf)
    scheduler = SlurmScheduler(slurm_conf=tmp_path / "slurm.conf", timeout_s=1)
    started = time.monotonic()

    with pytest.raises(ExecutorError) as error:
        scheduler.node("gpu-001")

    assert str(error.value) == "scontrol show node gpu-001 -o: no answer within 1 s"
    assert time.monotonic() - started < 5


def test_ping_says_slurmctld_answers_and_fails_for_a_slurm_conf_that_is_not_there(slurm,
                                                                                  tmp_path):
    assert "UP" in SlurmScheduler(slurm_conf=slurm.slurm_conf, timeout_s=15).ping()
    with pytest.raises(ExecutorError, match="scontrol ping"):
        SlurmScheduler(slurm_conf=tmp_path / "slurm.conf", timeout_s=15).ping()
