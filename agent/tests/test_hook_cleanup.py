"""The Epilog hook cleans up after the job before its scripts run: the job's processes ended,
GPU memory still held found through NVML (the fake one, with the real reading's shape), the
user's /dev/shm files removed, and what it found spooled for the agent as a job_cleanup
notice, the GPU memory still held recorded for the agent to announce as job_leftovers. The
hook runs as Slurm runs it, from a bash Epilog whose output goes to a helper process that
carries the job's SLURM_JOB_ID. The cleanup never fails the Epilog. Needs root for the
Epilog runs (to make a test user, and to end processes)."""

import json
import os
import pwd
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from agent.config import build_hygiene_config
from agent.hook import job_user, run_hook
from agent.hygiene.job_cleanup import LeftoversWatcher, load_leftovers
from agent.tests.fake_pynvml import FakeNvml
from agent.work import scripts

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534

# The hook as the Epilog runs it, with the fake pynvml serving [gpu, pid] compute processes.
HOOK = r"""
import json, os, sys
from agent.config import build_hygiene_config
from agent.hook import run_hook
from agent.tests.fake_pynvml import FakeNvml
state, settings, holders = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
fake = FakeNvml(gpu_count=2)
for gpu, pid in holders:
    fake.add_compute_process(gpu, pid)
sys.exit(run_hook("job_end", state, dict(os.environ), hygiene=build_hygiene_config(settings),
                  nvml=fake))
"""

# An Epilog that sends its output to a helper first, as `exec > >(logger -t epilog)` does,
# runs the hook, and writes a line after it: had the helper (which has the job's
# SLURM_JOB_ID) been ended, that write would kill the Epilog with SIGPIPE.
EPILOG = 'exec > >(exec cat >> "$1"); "$2" -c "$3" "$4" "$5" "$6"; echo "epilog: hook exited $?"'

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to end the job")




@pytest.fixture
def processes():
    """Started sleeps, killed at the end: a list to append Popen objects to."""
    started = []
    yield started
    for process in started:
        process.kill()
        process.wait()


def sleeper(started, *, uid, job_id=None):
    """A `sleep` of `uid` out of its own session (as `setsid` leaves a daemon), with
    SLURM_JOB_ID=job_id where given."""
    env = {"PATH": os.environ["PATH"]}
    if job_id is not None:
        env["SLURM_JOB_ID"] = job_id
    process = subprocess.Popen([shutil.which("sleep"), "120"], env=env, user=uid,
                               group=pwd.getpwuid(uid).pw_gid if uid else 0, extra_groups=[],
                               start_new_session=True)
    started.append(process)
    return process


def run_epilog(tmp_path, env, state, settings, holders=()):
    """(the Epilog's exit status, what its helper wrote) for the hook run from EPILOG."""
    log = tmp_path / "epilog.log"
    done = subprocess.run(
        ["bash", "-c", EPILOG, "epilog", str(log), sys.executable, HOOK, state,
         json.dumps(settings), json.dumps(list(holders))],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    deadline = time.monotonic() + 10  # the helper writes once the Epilog has gone
    while "epilog:" not in (log.read_text() if log.exists() else ""):
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
    return done.returncode, (log.read_text() if log.exists() else "") + done.stderr


def new_job_id():
    return str(900000 + uuid.uuid4().int % 99999)


@needs_root
def test_job_end_cleans_up_records_the_leftovers_and_the_agent_announces_them(
        tmp_path, test_user, processes):
    job_id = new_job_id()
    daemon = sleeper(processes, uid=test_user.pw_uid, job_id=job_id)
    stranger = sleeper(processes, uid=NOBODY)  # holds GPU memory for no job
    state = str(tmp_path / "state")
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / "nccl-shm-1").write_bytes(b"x" * 4096)
    os.chown(shm / "nccl-shm-1", test_user.pw_uid, test_user.pw_gid)
    settings = {"job_cleanup_grace": 1, "shm_dir": str(shm),
                "slurm_cgroup_root": str(tmp_path / "no-cgroup")}
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": job_id,
           "SLURM_JOB_UID": str(test_user.pw_uid), "SLURM_JOB_USER": test_user.pw_name,
           "SLURMD_NODENAME": "gpu-001", "SLURM_JOB_GPUS": "0,1"}

    status, output = run_epilog(tmp_path, env, state, settings,
                                [[0, daemon.pid], [1, stranger.pid]])

    assert status == 0, output
    assert "epilog: hook exited 0" in output
    assert daemon.wait(timeout=5) is not None  # ended
    assert stranger.poll() is None  # not the job's: left alone, and not reported
    assert list(shm.iterdir()) == []
    [notice] = [frame for _, frame in scripts.ResultSpool(state).pending()]
    assert notice["signature"] == "job_cleanup" and notice["severity"] == "info"
    assert notice["detail"]["method"] == "proc" and notice["detail"]["found"] == 1
    assert notice["detail"]["uid"] == test_user.pw_uid
    assert notice["message"].startswith(
        f"job {job_id} ({test_user.pw_name}): 1 process found by /proc, 1 ended")
    # The hook spools no job_leftovers: it records them, for the agent to announce.
    [record] = load_leftovers(state)
    assert (record["job_id"], record["announced"]) == (job_id, False)
    warning = record["warning"]
    assert warning["signature"] == "job_leftovers" and warning["severity"] == "warning"
    # The daemon, which NVML still lists (the fake keeps it), holds the memory.
    assert [p["pid"] for p in warning["detail"]["gpu_processes"]] == [daemon.pid]

    fake = FakeNvml(gpu_count=2)
    fake.add_compute_process(0, daemon.pid)
    assert LeftoversWatcher(state_dir=state, nvml=fake).check_once() == [warning]


@needs_root
def test_the_epilog_s_own_helper_outlives_a_root_job_s_cleanup(tmp_path, processes):
    """A root job: uid alone cannot tell the Epilog's helper (root, the job's SLURM_JOB_ID)
    from the job's processes; being the Epilog's descendant does."""
    job_id = new_job_id()
    daemon = sleeper(processes, uid=0, job_id=job_id)
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / "PostgreSQL.1234").write_bytes(b"x")  # root's and system users' are daemons'
    settings = {"job_cleanup_grace": 1, "shm_dir": str(shm),
                "slurm_cgroup_root": str(tmp_path / "no-cgroup")}
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": job_id, "SLURM_JOB_UID": "0",
           "SLURM_JOB_USER": "root"}

    status, output = run_epilog(tmp_path, env, str(tmp_path / "state"), settings)

    assert status == 0, output  # not killed by SIGPIPE
    assert "epilog: hook exited 0" in output
    assert daemon.wait(timeout=5) is not None
    assert (shm / "PostgreSQL.1234").exists()
    [notice] = [frame for _, frame in scripts.ResultSpool(str(tmp_path / "state")).pending()]
    assert notice["detail"]["shm_skipped"] == "root is a system user (uid 0)"


def test_the_job_s_user_comes_from_slurm_job_uid_else_its_name():
    root = pwd.getpwuid(0).pw_name
    assert job_user({"SLURM_JOB_UID": "0", "SLURM_JOB_USER": "alice"}) == (0, "alice")
    assert job_user({"SLURM_JOB_UID": "0"}) == (0, root)
    assert job_user({"SLURM_JOB_USER": root}) == (0, root)
    assert job_user({"SLURM_JOB_UID": "4000000000"}) == (4000000000, "4000000000")
    assert job_user({"SLURM_JOB_USER": "no-such-user-here"}) == (None, "no-such-user-here")
    assert job_user({"SLURM_JOB_UID": "x"}) == (None, "")
    assert job_user({}) == (None, "")


def test_a_job_whose_user_is_unknown_has_nothing_ended(tmp_path, processes):
    job_id = new_job_id()
    process = sleeper(processes, uid=os.geteuid(), job_id=job_id)
    shm = tmp_path / "shm"
    shm.mkdir()
    hygiene = build_hygiene_config({"shm_dir": str(shm),
                                    "slurm_cgroup_root": str(tmp_path / "no-cgroup")})
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": job_id,
           "SLURM_JOB_USER": "no-such-user-here"}

    assert run_hook("job_end", str(tmp_path), env, hygiene=hygiene, nvml=FakeNvml()) == 0

    assert process.poll() is None
    [notice] = [frame for _, frame in scripts.ResultSpool(str(tmp_path)).pending()]
    assert notice["message"].startswith(
        f"job {job_id} (no-such-user-here): no user no-such-user-here on this node: no "
        "process ended")


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
