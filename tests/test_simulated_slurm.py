"""The demo's simulated Slurm (demo/slurm, on demo/bin/) against real Slurm (tests/slurm.py):
the console's Slurm adapter and job accounting give the same answers from both for one
scenario: a two-node batch job runs, its node is drained, the job is requeued, the node
resumed, and sacct lists the job."""

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from agent.sim.workload import Workload, new_state
from jobs.sacct import parse_sacct, run_sacct
from schedulers import ExecutorError
from schedulers.slurm import SlurmScheduler

from .slurm import wait_for

ROOT = Path(__file__).resolve().parent.parent
SIM_NODES = [f"gpu-{i:03d}" for i in range(1, 33)]


class Scenario:
    """A running two-or-more-node job on `node`, and the scheduler that reaches it."""

    def __init__(self, scheduler, job_id, user, account, nodes, gpus, slurm_conf=None):
        self.scheduler, self.job_id, self.user, self.account = scheduler, job_id, user, account
        self.nodes, self.gpus, self.slurm_conf = tuple(nodes), gpus, slurm_conf
        self.node = self.nodes[0]


@pytest.fixture
def simulated(tmp_path, monkeypatch):
    """The simulated Slurm of a 32-node fleet with a multi-node job running now, with more
    than ten minutes left: the first seed that has one (nearly always the first)."""
    monkeypatch.setenv("PATH", f"{ROOT / 'demo' / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("DEMO_SLURM_PYTHON", sys.executable)
    state = tmp_path / "slurm.json"
    monkeypatch.setenv("DEMO_SLURM_STATE", str(state))
    now = time.time()
    for attempt in range(50):
        workload = Workload(SIM_NODES, seed=f"test-{attempt}")
        jobs = [job for node in SIM_NODES if (job := workload.running_on(node, now))
                and len(job.nodes) > 1 and job.requeueable
                and job.start + job.time_limit_s > now + 600]
        if jobs:
            break
    job = jobs[0]
    state.write_text(json.dumps(new_state(SIM_NODES, seed=workload.seed)))
    return Scenario(SlurmScheduler(timeout_s=15), job.id, job.user, job.account, job.nodes,
                    job.gpus)


@pytest.fixture
def real(slurm):
    """A real two-node batch job of alice's (account research) with every GPU of both."""
    slurm.add_user("alice", "research")
    job_id = slurm.sbatch("sleep 600", user="alice", account="research", gres="gpu:8",
                          nodelist="gpu-001,gpu-002", extra=["--nodes=2", "--requeue"])
    slurm.wait_job_state(job_id, "RUNNING")
    return Scenario(SlurmScheduler(slurm_conf=slurm.slurm_conf, timeout_s=15), job_id, "alice",
                    "research", ["gpu-001", "gpu-002"], 16, slurm_conf=slurm.slurm_conf)


@pytest.fixture(params=["simulated", pytest.param("real", marks=pytest.mark.integration)])
def scenario(request):
    return request.getfixturevalue(request.param)


def test_the_adapter_lists_drains_requeues_and_resumes_the_same_way(scenario):
    scheduler = scenario.scheduler
    [job] = [job for job in scheduler.running_jobs(scenario.node) if job.id == scenario.job_id]
    assert (job.user, job.account, job.nodes, job.gpus) == (
        scenario.user, scenario.account, scenario.nodes, scenario.gpus)
    assert (job.batch, job.requeueable) == (True, True)
    assert job.run_time_s >= 0 and (job.time_left_s is None or job.time_left_s > 0)

    assert scheduler.drain(scenario.node, "clusterui repair #7") == (
        f"drained {scenario.node}: clusterui repair #7")
    node = scheduler.node(scenario.node)
    assert node.drained and node.reason == "clusterui repair #7" and "DRAIN" in node.state
    assert scheduler.drain(scenario.node, "clusterui repair #7") == (
        f"{scenario.node} already drained: clusterui repair #7")

    output = scheduler.stop(scenario.node, [job])
    assert output.startswith(f"requeued {scenario.job_id};")
    # Held to its nodes, the job waits for the drained one.
    assert scheduler._job_states([scenario.job_id]) == {scenario.job_id: "PENDING"}
    assert scenario.job_id not in [j.id for j in scheduler.running_jobs(scenario.node)]
    assert scheduler.stop(scenario.node, [job]) == "no job left to stop"

    assert scheduler.resume(scenario.node).startswith(f"resumed {scenario.node} (was ")
    assert not scheduler.node(scenario.node).drained
    assert scheduler.resume(scenario.node).startswith(f"{scenario.node} already in service")


def test_sacct_lists_the_job_with_its_nodes_and_gpus(scenario):
    def listed():
        now = timezone.now()
        jobs, warnings = parse_sacct(run_sacct(scenario.slurm_conf, now - timedelta(days=1),
                                               now))
        assert warnings == []
        return [job for job in jobs if job.job_id == scenario.job_id]

    # slurmdbd hears of a job's start a moment after slurmctld.
    wait_for(listed, timeout=30, what=f"sacct lists job {scenario.job_id}", interval=0.5)
    [job] = listed()
    assert (job.user, job.account, job.nodes, job.gpus, job.state) == (
        scenario.user, scenario.account, scenario.nodes, scenario.gpus, "RUNNING")
    assert job.start is not None and job.end is None


def test_the_adapter_reads_slurms_refusals_the_same_way(scenario):
    with pytest.raises(ExecutorError, match="gpu-999"):
        scenario.scheduler.node("gpu-999")
    assert scenario.scheduler._job_states(["999999999"]) == {}
