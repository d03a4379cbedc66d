"""The Epilog hook cleans up after the job before its scripts run: the job's processes ended,
GPU memory still held found through NVML (the fake one, with the real reading's shape), the
user's /dev/shm files removed, and what it found spooled for the agent as a job_cleanup
notice and a job_leftovers warning. The cleanup never fails the Epilog."""

import os
import subprocess
import sys
import uuid

import pytest

from agent import host, scripts
from agent.config import build_hygiene_config
from agent.hook import run_hook
from agent.hygiene.job_cleanup import load_leftovers
from agent.tests.fake_pynvml import FakeNvml


@pytest.fixture
def job(tmp_path):
    """A job's process (a daemon out of its own session, as `setsid` leaves one) with the
    job's SLURM_JOB_ID, and a stranger holding GPU memory for no job."""
    job_id = str(900000 + uuid.uuid4().int % 99999)
    env = {**os.environ, "SLURM_JOB_ID": job_id}
    daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env,
                              start_new_session=True)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                env={k: v for k, v in os.environ.items()
                                     if k != "SLURM_JOB_ID"})
    yield job_id, daemon, stranger
    for process in (daemon, stranger):
        process.kill()
        process.wait()


def test_job_end_cleans_up_then_runs_the_scripts(tmp_path, job, monkeypatch):
    job_id, daemon, stranger = job
    state = str(tmp_path / "state")
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / "nccl-shm-1").write_bytes(b"x" * 4096)
    monkeypatch.setattr(host, "user_has_other_jobs", lambda node, user, job: False)
    fake = FakeNvml(gpu_count=2)
    fake.add_compute_process(0, daemon.pid)
    fake.add_compute_process(1, stranger.pid)
    hygiene = build_hygiene_config({"job_cleanup_grace": 1, "shm_dir": str(shm),
                                    "slurm_cgroup_root": str(tmp_path / "no-cgroup")})
    env = {**os.environ, "SLURM_JOB_ID": job_id, "SLURM_JOB_USER": "root",
           "SLURMD_NODENAME": "gpu-001", "SLURM_JOB_GPUS": "0,1"}

    assert run_hook("job_end", state, env, hygiene=hygiene, nvml=fake) == 0

    assert daemon.wait(timeout=5) is not None  # ended
    assert stranger.poll() is None  # not the job's: left alone, but reported
    assert list(shm.iterdir()) == []
    frames = [frame for _, frame in scripts.ResultSpool(state).pending()]
    notice, warning = frames
    assert notice["signature"] == "job_cleanup" and notice["severity"] == "info"
    assert notice["detail"]["method"] == "proc" and notice["detail"]["found"] == 1
    assert notice["message"].startswith(f"job {job_id} (root): 1 process found by /proc, 1 ended")
    assert warning["signature"] == "job_leftovers" and warning["severity"] == "warning"
    # The daemon NVML still lists (the fake keeps it) and the stranger hold the memory.
    assert {p["pid"] for p in warning["detail"]["gpu_processes"]} == {daemon.pid, stranger.pid}
    assert [job["job_id"] for job in load_leftovers(state)] == [job_id]


def test_a_cleanup_that_breaks_never_fails_the_epilog(tmp_path, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("something unexpected")

    monkeypatch.setattr("agent.hygiene.job_cleanup.clean_job", broken)
    env = {**os.environ, "SLURM_JOB_ID": "77", "SLURM_JOB_USER": "root"}
    assert run_hook("job_end", str(tmp_path), env) == 0
    assert "cleaning up after job 77 failed" in caplog.text


def test_no_cleanup_at_job_start_or_with_hygiene_off(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr("agent.hygiene.job_cleanup.clean_job",
                        lambda **kwargs: calls.append(kwargs))
    env = {**os.environ, "SLURM_JOB_ID": "78", "SLURM_JOB_USER": "root"}
    run_hook("job_start", str(tmp_path), env)
    run_hook("job_end", str(tmp_path), env, hygiene=build_hygiene_config({"hygiene": False}))
    assert calls == []
