"""The job-end cleanup against a real "job" on this machine: processes started with a
SLURM_JOB_ID of their own, as a throwaway user, one of them a setsid double-forked daemon
that ignores SIGTERM and leaves files in a shared-memory folder; a real cgroup v2 job
cgroup where the machine has a writable one; GPUs from the fake pynvml, whose process
pids point at real processes. Needs root; every process started here is killed in a
finalizer."""

import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pynvml
import pytest

from agent.hygiene.job_cleanup import (
    LeftoversWatcher,
    clean_job,
    cleanup_event,
    end_processes,
    find_job_processes,
    gpu_memory_holders,
    leftovers_event,
    load_leftovers,
    parse_gpu_minors,
    record_leftovers,
    remove_user_shm,
)
from agent.hygiene.processes import is_running, process_pids, read_process, send_signal
from agent.protocol import encode
from agent.tests.fake_pynvml import FakeNvml

REPO = Path(__file__).resolve().parents[2]
NO_CGROUP = "/nonexistent/slurmstepd.scope"
MIB = 2**20

# A job's processes. "step": a plain step, which SIGTERM ends. "daemon": the classic
# double fork (fork, setsid, fork), the survivor ignoring SIGTERM, after leaving a 1 MiB
# PyTorch-like segment and an NCCL-like folder in the shm folder (argv[2]). Each prints
# its pid once it is set up, lets go of stdout, and sleeps.
JOB_PROCESS = r"""
import os, signal, sys, time
if sys.argv[1] == "daemon":
    if os.fork():
        os._exit(0)
    os.setsid()
    if os.fork():
        os._exit(0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    shm_dir = sys.argv[2]
    with open(os.path.join(shm_dir, "torch_4821_0"), "wb") as f:
        f.write(b"\0" * 2**20)
    os.mkdir(os.path.join(shm_dir, "nccl-4821"))
    with open(os.path.join(shm_dir, "nccl-4821", "ring0"), "wb") as f:
        f.write(b"\0" * 4096)
print(os.getpid(), flush=True)
os.dup2(os.open(os.devnull, os.O_RDWR), 1)
while True:
    time.sleep(60)
"""

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to make a test user")


@pytest.fixture(scope="module")
def test_user():
    """A throwaway user (uid >= 1000, no home); its processes are killed and it is
    removed afterwards."""
    name = f"cuitest{uuid.uuid4().hex[:8]}"
    try:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                       check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot make a test user: {exc}")
    entry = pwd.getpwnam(name)
    yield entry
    for pid in process_pids():
        info = read_process(pid)
        if info is not None and info["uid"] == entry.pw_uid:
            send_signal(info, signal.SIGKILL)
    for _ in range(50):
        if subprocess.run(["userdel", name], capture_output=True).returncode == 0:
            break
        time.sleep(0.1)  # "user is currently used by process": its last ones are going


@pytest.fixture(scope="module")
def python(test_user):
    """A Python the test user may run (this venv's may sit under root's home)."""
    for candidate in (sys.executable, "/usr/bin/python3"):
        try:
            result = subprocess.run([candidate, "-c", "pass"], user=test_user.pw_uid,
                                    group=test_user.pw_gid, extra_groups=[],
                                    capture_output=True, timeout=30)
        except OSError:
            continue
        if result.returncode == 0:
            return candidate
    pytest.skip("no Python the test user can run")


@pytest.fixture
def job_id():
    return str(900000000 + uuid.uuid4().int % 100000000)


@pytest.fixture
def shm_dir():
    """A folder like /dev/shm (mode 1777), outside pytest's root-only tmp_path."""
    folder = tempfile.mkdtemp(prefix="clusterui-shm-")
    os.chmod(folder, 0o1777)
    yield folder
    shutil.rmtree(folder)


class Started:
    """The processes a test started, all killed (and reaped) at its end."""

    def __init__(self):
        self.children = []  # Popen objects
        self.detached = []  # entries of processes left to init

    def close(self):
        for entry in self.detached:
            send_signal(entry, signal.SIGKILL)
        for child in self.children:
            child.kill()
            child.wait()


@pytest.fixture
def started():
    tracker = Started()
    yield tracker
    tracker.close()


def start(started, argv, *, job_id=None, user=None):
    """A sleeping process, with SLURM_JOB_ID=job_id in its environment where given; its
    read_process() entry."""
    env = {"PATH": os.environ["PATH"]}
    if job_id is not None:
        env["SLURM_JOB_ID"] = job_id
    as_user = {} if user is None else {
        "user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    child = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True, **as_user)
    started.children.append(child)
    pid = int(child.stdout.readline())
    entry = read_process(pid)
    if pid != child.pid:  # a daemon: its launcher has exited
        child.wait(timeout=10)
        started.detached.append(entry)
    return entry


def start_sleeper(started, **kwargs):
    """A `sleep` (a shell that says its pid, then becomes sleep)."""
    entry = start(started, ["sh", "-c", "echo $$; exec sleep 60"], **kwargs)
    deadline = time.monotonic() + 10
    while read_process(entry["pid"])["name"] != "sleep":
        assert time.monotonic() < deadline, "sleep did not start"
        time.sleep(0.01)
    return read_process(entry["pid"])


def start_job(started, test_user, python, job_id, shm_dir):
    """(the step's entry, the daemon's entry)."""
    step = start(started, [python, "-c", JOB_PROCESS, "step"], job_id=job_id, user=test_user)
    daemon = start(started, [python, "-c", JOB_PROCESS, "daemon", shm_dir], job_id=job_id,
                   user=test_user)
    return step, daemon


def other_users_files(shm_dir, test_user):
    """Files clean_job must leave: root's, nobody's, nobody's inside the test user's
    folder, and a file of the test user's reached only through the test user's symlink."""
    root_file = Path(shm_dir, "root-segment")
    root_file.write_bytes(b"r" * 100)
    nobody_file = Path(shm_dir, "nobody-segment")
    nobody_file.write_bytes(b"n" * 100)
    os.chown(nobody_file, 65534, 65534)
    shared_folder = Path(shm_dir, "shared")
    shared_folder.mkdir()
    os.chown(shared_folder, test_user.pw_uid, test_user.pw_gid)
    nobody_inside = shared_folder / "nobody-inside"
    nobody_inside.write_bytes(b"n")
    os.chown(nobody_inside, 65534, 65534)
    outside = Path(tempfile.mkdtemp(prefix="clusterui-outside-"))
    victim = outside / "victim"
    victim.write_bytes(b"v")
    os.chown(victim, test_user.pw_uid, test_user.pw_gid)
    link = Path(shm_dir, "link-to-outside")
    link.symlink_to(outside)
    os.lchown(link, test_user.pw_uid, test_user.pw_gid)
    return [root_file, nobody_file, nobody_inside, victim], outside


def test_clean_job_finds_the_job_by_proc_ends_it_and_removes_the_user_s_shm_files(
        started, test_user, python, job_id, shm_dir):
    step, daemon = start_job(started, test_user, python, job_id, shm_dir)
    bystander = start_sleeper(started, job_id=job_id + "1")  # another job's id, longer
    kept, outside = other_users_files(shm_dir, test_user)
    try:
        report = clean_job(job_id=job_id, user=test_user.pw_name, gpus="0",
                           user_has_other_jobs=False, nvml=FakeNvml(), grace_s=0.5,
                           cgroup_root=NO_CGROUP, shm_dir=shm_dir)
        assert all(path.exists() for path in kept)
    finally:
        shutil.rmtree(outside)

    assert report["method"] == "proc"
    assert report["found"] == 2
    assert sorted(p["pid"] for p in report["processes"]) == sorted([step["pid"], daemon["pid"]])
    for process in report["processes"]:
        assert process["user"] == test_user.pw_name
        assert process["cmdline"].startswith(f"{python} -c ")
        assert len(process["cmdline"]) <= 200
    assert (report["ended"], report["killed"], report["left"]) == (
        [step["pid"]], [daemon["pid"]], [])
    assert (report["ended_count"], report["killed_count"], report["left_count"]) == (1, 1, 0)
    assert not is_running(step) and not is_running(daemon)
    assert is_running(bystander)
    assert sorted(report["shm_removed"], key=lambda item: item["path"]) == [
        {"path": f"{shm_dir}/nccl-4821/", "bytes": 0},
        {"path": f"{shm_dir}/nccl-4821/ring0", "bytes": 4096},
        {"path": f"{shm_dir}/torch_4821_0", "bytes": MIB},
    ]
    assert (report["shm_removed_files"], report["shm_removed_bytes"]) == (2, MIB + 4096)
    assert report["shm_skipped"] is None
    assert Path(shm_dir, "shared").is_dir()  # the test user's, but holding nobody's file
    assert (report["gpu_processes"], report["gpu_check"]) == ([], "ok")
    assert 0 < report["duration_s"] < 10

    event = cleanup_event(report)
    encode(event)
    assert (event["signature"], event["severity"], event["state"], event["gpu_uuid"]) == (
        "job_cleanup", "info", "active", None)
    assert event["message"] == (
        f"job {job_id} ({test_user.pw_name}): 2 processes found by /proc, 1 ended, 1 killed; "
        f"2 {shm_dir} files removed (1 MiB); GPUs clean")
    assert event["detail"] == json.loads(json.dumps(report))


@pytest.mark.parametrize("has_other_jobs, reason", [
    (True, "the user has another job on this node"),
    (None, "unknown whether the user has another job"),
])
def test_shm_files_stay_while_the_user_may_have_another_job(
        started, test_user, python, job_id, shm_dir, has_other_jobs, reason):
    start_job(started, test_user, python, job_id, shm_dir)

    report = clean_job(job_id=job_id, user=test_user.pw_name, user_has_other_jobs=has_other_jobs,
                       nvml=FakeNvml(), grace_s=0.5, cgroup_root=NO_CGROUP, shm_dir=shm_dir)

    assert (report["found"], report["left"]) == (2, [])
    assert (report["shm_removed"], report["shm_skipped"]) == ([], reason)
    assert sorted(os.listdir(shm_dir)) == ["nccl-4821", "torch_4821_0"]
    assert f"{shm_dir} kept: {reason}" in cleanup_event(report)["message"]


def test_remove_user_shm_refuses_a_user_the_node_does_not_know(shm_dir):
    with pytest.raises(KeyError):
        remove_user_shm("no-such-user-here", shm_dir=shm_dir)
    report = clean_job(job_id="1", user="no-such-user-here", user_has_other_jobs=False,
                       nvml=None, grace_s=0.1, cgroup_root=NO_CGROUP, shm_dir=shm_dir)
    assert report["shm_skipped"] == "no user no-such-user-here on this node"


def test_the_epilog_itself_and_its_ancestors_are_not_the_job_s(started, job_id):
    """The Epilog runs with the job's SLURM_JOB_ID: a shell with it runs a Python with
    it, which looks for the job's processes."""
    step = start_sleeper(started, job_id=job_id)
    code = ("import json, os; from agent.hygiene.job_cleanup import find_job_processes; "
            f"method, found = find_job_processes({job_id!r}, cgroup_root={NO_CGROUP!r}); "
            "print(json.dumps([os.getpid(), method, [p['pid'] for p in found]]))")
    shell = subprocess.run(
        ["sh", "-c", f'echo $$; "{sys.executable}" -c "{code}"; true'],
        env={"PATH": os.environ["PATH"], "SLURM_JOB_ID": job_id}, cwd=REPO,
        capture_output=True, text=True, timeout=60, check=True,
    )
    shell_pid, result = shell.stdout.splitlines()
    python_pid, method, pids = json.loads(result)

    assert method == "proc"
    assert pids == [step["pid"]]
    assert int(shell_pid) != step["pid"] and python_pid != step["pid"]


def writable_cgroup2_root():
    for path in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        kind = subprocess.run(["stat", "-fc", "%T", path], capture_output=True, text=True)
        if kind.stdout.strip() != "cgroup2fs":
            continue
        root = os.path.join(path, f"clusterui-test-{uuid.uuid4().hex[:8]}")
        try:
            os.mkdir(root)
        except OSError:
            continue
        return root
    return None


@pytest.fixture
def cgroup_root():
    root = writable_cgroup2_root()
    if root is None:
        pytest.skip("no writable cgroup v2 hierarchy here (/sys/fs/cgroup/unified or "
                    "/sys/fs/cgroup)")
    yield root
    for folder, _, _ in sorted(os.walk(root), key=lambda item: -len(item[0])):
        with open(os.path.join(folder, "cgroup.procs")) as f:
            for pid in f.read().split():  # the test's own sleepers
                os.kill(int(pid), signal.SIGKILL)
        for _ in range(50):  # a cgroup goes once its last (killed) process is reaped
            try:
                os.rmdir(folder)
                break
            except OSError:
                time.sleep(0.05)


def test_a_job_with_a_cgroup_is_found_in_it_and_its_step_cgroups(cgroup_root, started, job_id):
    job_dir = Path(cgroup_root, f"job_{job_id}")
    (job_dir / "step_0").mkdir(parents=True)
    Path(cgroup_root, "job_1").mkdir()  # another job
    in_job = start_sleeper(started)
    in_step = start_sleeper(started)
    in_other_job = start_sleeper(started)
    (job_dir / "cgroup.procs").write_text(str(in_job["pid"]))
    (job_dir / "step_0" / "cgroup.procs").write_text(str(in_step["pid"]))
    Path(cgroup_root, "job_1", "cgroup.procs").write_text(str(in_other_job["pid"]))

    method, found = find_job_processes(job_id, cgroup_root=cgroup_root)

    assert method == "cgroup"
    assert sorted(p["pid"] for p in found) == sorted([in_job["pid"], in_step["pid"]])
    assert all(p["name"] == "sleep" and p["user"] == "root" for p in found)
    assert find_job_processes("2", cgroup_root=cgroup_root) == ("proc", [])


def test_end_processes_kills_what_ignores_sigterm(started, test_user, python, job_id, shm_dir):
    step, daemon = start_job(started, test_user, python, job_id, shm_dir)
    gone = {**start_sleeper(started), "start_ticks": 0}  # a pid now another process's

    outcome = end_processes([step, daemon, gone], grace_s=0.3)

    assert outcome == {"ended": [step["pid"], gone["pid"]], "killed": [daemon["pid"]],
                       "left": []}
    assert is_running(read_process(gone["pid"]))


def test_parse_gpu_minors():
    assert parse_gpu_minors("0,1") == {0, 1}
    assert parse_gpu_minors("0-3") == {0, 1, 2, 3}
    assert parse_gpu_minors(" 0-1, 4 ") == {0, 1, 4}
    assert parse_gpu_minors("7") == {7}
    assert parse_gpu_minors("") is None
    assert parse_gpu_minors(None) is None
    assert parse_gpu_minors("gpu") is None


def test_the_fake_serves_minors_and_pynvml_s_process_objects():
    fake = FakeNvml(gpu_count=2)
    handle = fake.nvmlDeviceGetHandleByIndex(1)
    assert fake.nvmlDeviceGetMinorNumber(fake.nvmlDeviceGetHandleByIndex(0)) == 0
    assert fake.nvmlDeviceGetMinorNumber(handle) == 1
    assert fake.nvmlDeviceGetComputeRunningProcesses(handle) == []

    fake.add_compute_process(1, 424)
    fake.add_compute_process(1, 425, used_bytes=None)
    first, second = fake.nvmlDeviceGetComputeRunningProcesses(handle)

    assert isinstance(first, pynvml.nvmlFriendlyObject)
    assert vars(first) == {"pid": 424, "usedGpuMemory": 1002 * MIB,
                           "gpuInstanceId": 0xFFFFFFFF, "computeInstanceId": 0xFFFFFFFF}
    assert (second.pid, second.usedGpuMemory) == (425, None)


def test_gpu_memory_holders_leave_out_another_job_s_processes(started, job_id):
    ours = start_sleeper(started, job_id=job_id)
    other_job = start_sleeper(started, job_id=job_id + "1")
    no_job = start_sleeper(started)
    fake = FakeNvml(gpu_count=3)
    fake.add_compute_process(0, ours["pid"])
    fake.add_compute_process(1, other_job["pid"])
    fake.add_compute_process(1, no_job["pid"], used_bytes=None)

    holders = gpu_memory_holders(fake, job_id=job_id)

    assert holders == [
        {"pid": ours["pid"], "gpu_index": 0, "gpu_uuid": fake.uuid(0), "gpu_minor": 0,
         "used_memory_bytes": 1002 * MIB, "name": "sleep", "job_id": job_id,
         "start_ticks": ours["start_ticks"]},
        {"pid": no_job["pid"], "gpu_index": 1, "gpu_uuid": fake.uuid(1), "gpu_minor": 1,
         "used_memory_bytes": None, "name": "sleep", "job_id": None,
         "start_ticks": no_job["start_ticks"]},
    ]
    assert [h["pid"] for h in gpu_memory_holders(fake, job_id=job_id, gpu_minors={1})] == [
        no_job["pid"]]

    fake.lost = {0}
    errors = []
    assert [h["pid"] for h in gpu_memory_holders(fake, job_id=job_id, errors=errors)] == [
        no_job["pid"]]
    assert errors == ["GPU 0: GPU is lost"]


def test_the_gpu_check_says_why_nvml_is_unavailable(job_id, shm_dir):
    args = dict(job_id=job_id, user="root", user_has_other_jobs=True, grace_s=0.1,
                cgroup_root=NO_CGROUP, shm_dir=shm_dir)
    no_driver = clean_job(nvml=FakeNvml(init_error=pynvml.NVMLError_DriverNotLoaded), **args)
    no_pynvml = clean_job(nvml=None, **args)
    lost = FakeNvml(gpu_count=2)
    lost.lost = {1}
    one_lost = clean_job(nvml=lost, **args)

    assert no_driver["gpu_check"] == "NVML unavailable: Driver Not Loaded"
    assert no_pynvml["gpu_check"] == "NVML unavailable: pynvml could not be imported"
    assert one_lost["gpu_check"] == "GPU 1: GPU is lost"
    assert no_driver["gpu_processes"] == no_pynvml["gpu_processes"] == []
    assert cleanup_event(no_driver)["message"].endswith("; NVML unavailable: Driver Not Loaded")


def test_leftovers_are_recorded_and_cleared_once_their_memory_is_free(
        started, job_id, shm_dir, tmp_path):
    stuck = start_sleeper(started)  # holds GPU 1 memory; not the job's, so not ended
    fake = FakeNvml(gpu_count=2)
    fake.add_compute_process(1, stuck["pid"])
    report = clean_job(job_id=job_id, user="alice", gpus="1", user_has_other_jobs=True,
                       nvml=fake, grace_s=0.1, cgroup_root=NO_CGROUP, shm_dir=shm_dir)
    [holder] = report["gpu_processes"]
    assert (holder["pid"], holder["gpu_uuid"]) == (stuck["pid"], fake.uuid(1))
    assert "1 process still holding GPU memory" in cleanup_event(report)["message"]

    warning = leftovers_event(report)
    encode(warning)
    assert (warning["signature"], warning["severity"], warning["state"], warning["gpu_uuid"]) == (
        "job_leftovers", "warning", "active", None)
    assert warning["message"] == (
        f"job {job_id} (alice) left 1 process holding 1002 MiB of GPU memory after cleanup: "
        f"sleep (pid {stuck['pid']}) on GPU 1")
    assert warning["detail"] == {"job_id": job_id, "user": "alice", "gpu_processes": [holder]}

    state_dir = tmp_path / "state"
    record_leftovers(state_dir, report)
    record_leftovers(state_dir, {**report, "job_id": "17", "user": "bob"})
    record_leftovers(state_dir, report)  # again: replaces, not added
    assert stat.S_IMODE(os.stat(state_dir / "job_leftovers.json").st_mode) == 0o600
    [first, second] = load_leftovers(state_dir)
    assert (first["job_id"], second["job_id"]) == ("17", job_id)
    assert (second["user"], second["pids"], second["gpu_uuids"]) == (
        "alice", [stuck["pid"]], [fake.uuid(1)])

    assert LeftoversWatcher(state_dir=state_dir, nvml=None).check_once() == []
    watcher = LeftoversWatcher(state_dir=state_dir, nvml=fake)
    assert watcher.check_once() == []  # both still hold it (job 17 recorded the same pid)
    fake.lost = {0}
    fake.compute_processes.clear()
    assert watcher.check_once() == []  # a GPU NVML cannot read: nothing is cleared
    fake.lost = set()

    send_signal(stuck, signal.SIGKILL)
    [cleared] = watcher.check_once()  # one event per node, for both jobs
    assert (cleared["signature"], cleared["severity"], cleared["state"]) == (
        "job_leftovers", "info", "cleared")
    assert cleared["detail"] == {"job_ids": ["17", job_id]}
    assert cleared["message"] == (
        f"the GPU memory left by jobs 17 (bob), {job_id} (alice) is free")
    assert load_leftovers(state_dir) == []
    assert watcher.check_once() == []


def test_job_leftovers_stays_open_while_any_jobs_memory_is_held(started, tmp_path):
    freed, held = start_sleeper(started), start_sleeper(started)
    fake = FakeNvml(gpu_count=2)
    fake.add_compute_process(0, freed["pid"])
    fake.add_compute_process(1, held["pid"])
    for job, holder in (("21", freed), ("22", held)):
        record_leftovers(tmp_path, {"job_id": job, "user": "dana", "gpu_processes": [
            {"pid": holder["pid"], "gpu_uuid": fake.uuid(0), "start_ticks": holder["start_ticks"]}]})
    watcher = LeftoversWatcher(state_dir=tmp_path, nvml=fake)
    send_signal(freed, signal.SIGKILL)
    fake.compute_processes[0] = []
    assert watcher.check_once() == []  # job 22's memory is still held: the event stays open
    assert [job["job_id"] for job in load_leftovers(tmp_path)] == ["22"]
    send_signal(held, signal.SIGKILL)
    fake.compute_processes[1] = []
    [cleared] = watcher.check_once()
    assert cleared["detail"] == {"job_ids": ["22"]}


def test_a_recorded_pid_taken_by_another_process_holds_nothing(started, tmp_path):
    newcomer = start_sleeper(started)
    fake = FakeNvml()
    fake.add_compute_process(0, newcomer["pid"])
    holder = {"pid": newcomer["pid"], "gpu_uuid": fake.uuid(0),
              "start_ticks": newcomer["start_ticks"] - 1}
    record_leftovers(tmp_path, {"job_id": "5", "user": "carol", "gpu_processes": [holder]})

    [cleared] = LeftoversWatcher(state_dir=tmp_path, nvml=fake).check_once()

    assert cleared["detail"] == {"job_ids": ["5"]}


def test_the_events_stay_under_the_detail_limit_with_10000_processes(job_id):
    long_text = "x" * 5000
    processes = [{"pid": pid, "name": "python3", "cmdline": long_text, "user": "alice",
                  "start_ticks": 1} for pid in range(10000)]
    holders = [{"pid": pid, "gpu_index": pid % 8, "gpu_uuid": f"GPU-{pid:036d}",
                "gpu_minor": pid % 8, "used_memory_bytes": MIB, "name": "python3",
                "job_id": job_id, "start_ticks": 1} for pid in range(10000)]
    report = {
        "job_id": job_id, "user": "alice", "method": "proc", "found": 10000,
        "processes": processes, "ended": list(range(10000)), "killed": [], "left": [],
        "ended_count": 10000, "killed_count": 0, "left_count": 0,
        "gpu_processes": holders, "gpu_check": "ok", "shm_dir": "/dev/shm",
        "shm_removed": [{"path": f"/dev/shm/{long_text}{n}", "bytes": 1} for n in range(10000)],
        "shm_removed_files": 10000, "shm_removed_bytes": 10000, "shm_skipped": None,
        "duration_s": 12.5,
    }

    cleanup, leftovers = cleanup_event(report), leftovers_event(report)

    for event in (cleanup, leftovers):
        encode(event)
        assert len(json.dumps(event["detail"], separators=(",", ":"))) <= 16 * 1024
    assert cleanup["detail"]["found"] == 10000
    assert cleanup["detail"]["cut"]["processes"] == 10000
    assert 0 < len(cleanup["detail"]["processes"]) < 10000
    assert all(len(p["cmdline"]) == 1000 for p in cleanup["detail"]["processes"])
    assert 0 < len(leftovers["detail"]["gpu_processes"]) < 10000
    assert leftovers["detail"]["cut"] == {"gpu_processes": 10000}
    assert leftovers["message"].startswith(
        f"job {job_id} (alice) left 10000 processes holding 10000 MiB of GPU memory after "
        "cleanup: python3 (pid 0) on GPU 0, ")
    assert leftovers["message"].endswith(" and 9990 more")
