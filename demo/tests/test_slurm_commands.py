"""The demo's simulated Slurm commands (demo/slurm/commands.py) on their own: what they
refuse, and what scancel's signal and cancel do to the fleet's jobs. The console's adapter
against them and against real Slurm: tests/test_simulated_slurm.py."""

import json
import time

import pytest

from agent.sim.workload import Workload, new_state
from demo.slurm import commands
from demo.slurm.commands import CHECKPOINT_S, main

NODES = [f"gpu-{i:03d}" for i in range(1, 49)]


def running_jobs(seed, now):
    workload = Workload(NODES, seed=seed)
    return [job for node in NODES if (job := workload.running_on(node, now))]


@pytest.fixture
def seed():
    """The first seed with both a multi-node and a single-node job running now (nearly
    always the first: a lull of every single-node lane at once is rare, not impossible)."""
    now = time.time()
    return next(seed for seed in (f"commands-{n}" for n in range(50))
                if {len(job.nodes) > 1 for job in running_jobs(seed, now)} == {True, False})


@pytest.fixture
def state(tmp_path, monkeypatch, seed):
    path = tmp_path / "slurm.json"
    path.write_text(json.dumps(new_state(NODES, seed=seed)))
    monkeypatch.setenv("DEMO_SLURM_STATE", str(path))
    return path


def run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def running_job(state, multi_node=True):
    seed = json.loads(state.read_text())["seed"]
    return next(job for job in running_jobs(seed, time.time())
                if (len(job.nodes) > 1) == multi_node)


def test_without_the_state_file_they_say_they_are_the_demos(capsys, monkeypatch):
    monkeypatch.delenv("DEMO_SLURM_STATE", raising=False)
    status, out, err = run(capsys, "squeue")
    assert (status, out) == (1, "")
    assert "DEMO_SLURM_STATE is not set: these are the demo's Slurm commands" in err


@pytest.mark.parametrize("argv, message", [
    (["scontrol", "reboot", "gpu-001"], "the demo's scontrol does not know: reboot gpu-001"),
    (["scontrol", "update", "nodename=gpu-001", "state=drain"],
     "You must specify a reason when DOWNING or DRAINING a node"),
    (["scontrol", "update", "nodename=gpu-001", "state=resume"],
     "Invalid node state specified: gpu-001 is not drained"),
    (["scontrol", "update", "nodename=gpu-999", "state=drain", "reason=x"],
     "Invalid node name specified: gpu-999"),
    (["squeue", "-o", "%i|%Z"], "Invalid job format specification: %Z"),
    (["squeue", "--bogus"], "squeue: unrecognized arguments: --bogus"),
    (["sacct", "-X", "-P", "--format=JobID,Nonsense"], 'Invalid field requested: "nonsense"'),
    (["scancel", "99"], "Kill job error on job id 99: Invalid job id specified"),
])
def test_what_they_do_not_know_exits_1_with_slurms_kind_of_message(capsys, state, argv,
                                                                   message):
    status, out, err = run(capsys, *argv)
    assert status == 1 and message in err


def test_squeue_prints_a_header_unless_told_not_to(capsys, state):
    _, out, _ = run(capsys, "squeue", "-o", "%i|%T")
    assert out.splitlines()[0] == "JOBID|STATE"
    assert all(line.split("|")[1] in ("PENDING", "RUNNING") for line in out.splitlines()[1:])


def test_sigusr1_makes_a_job_checkpoint_then_requeue_itself(capsys, state):
    job = running_job(state)
    assert run(capsys, "scancel", "--signal=USR1", "--batch", job.id)[0] == 0
    saved = json.loads(state.read_text())["jobs"][job.id]
    assert 0 < saved["requeued_at"] - time.time() <= CHECKPOINT_S
    _, out, _ = run(capsys, "squeue", "-h", "-j", job.id, "-o", "%i|%T")
    assert out == f"{job.id}|RUNNING\n"  # still checkpointing


def test_scancel_ends_a_job_cancelled(capsys, state):
    job = running_job(state, multi_node=False)
    assert run(capsys, "scancel", job.id)[0] == 0
    _, out, _ = run(capsys, "squeue", "-h", "-t", "all", "-j", job.id, "-o", "%i|%T")
    assert out == f"{job.id}|CANCELLED\n"
    assert run(capsys, "squeue", "-h", "-w", job.nodes[0], "-t", "RUNNING", "-o", "%i")[1] == ""


def test_a_drain_shows_in_scontrol_with_who_set_it(capsys, state):
    assert run(capsys, "scontrol", "update", "nodename=gpu-003", "state=drain",
               "reason=clusterui repair #4")[0] == 0
    _, out, _ = run(capsys, "scontrol", "show", "node", "gpu-003", "-o")
    assert " State=" in out and "+DRAIN " in out
    assert out.rstrip().split(" Reason=")[1].startswith("clusterui repair #4 [root@")
    assert commands.show_node("gpu-004").count("+DRAIN") == 0
