"""The job-end cleanup against a real "job" on this machine: processes started with a
SLURM_JOB_ID of their own, as a throwaway user, one of them a setsid double-forked daemon
that ignores SIGTERM and leaves files in a shared-memory folder; a stand-in Epilog (a root
process with a helper that carries the job's SLURM_JOB_ID); a real cgroup v2 job cgroup
where the machine has a writable one; GPUs from the fake pynvml, whose process pids point
at real processes; hand-made /proc entries (test_hygiene_processes.fake_process) for a
process in D state and a pid reused mid-read. Needs root; every process started here is
killed in a finalizer."""

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pynvml
import pytest

from agent.connection.protocol import encode
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
from agent.hygiene.processes import is_running, read_process, send_signal
from agent.tests.fake_pynvml import FakeNvml
from agent.tests.test_hygiene_processes import (
    FAKE_PID,
    fake_process,
    fake_stat,
    finishes,
)

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

# A stand-in for the Epilog shell (root): it forks a helper that runs `sleep` with the
# job's SLURM_JOB_ID as the job's user (as a helper the Epilog starts with `su` or
# `setpriv` would be), prints the helper's pid and waits for it.
EPILOG = r"""
import os, sys
uid, gid, job_id = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
helper = os.fork()
if helper == 0:
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    os.execve(sys.argv[4], ["sleep", "60"], {"SLURM_JOB_ID": job_id})
print(helper, flush=True)
os.dup2(os.open(os.devnull, os.O_RDWR), 1)
os.waitpid(helper, 0)
"""

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to make a test user")






@pytest.fixture
def job_id():
    return str(900000000 + uuid.uuid4().int % 100000000)


@pytest.fixture
def epilog(test_user, job_id):
    """The stand-in Epilog: .pid, and .helper, the read_process() entry of its helper."""
    process = subprocess.Popen(
        [sys.executable, "-c", EPILOG, str(test_user.pw_uid), str(test_user.pw_gid), job_id,
         shutil.which("sleep")], stdout=subprocess.PIPE, text=True)
    helper_pid = int(process.stdout.readline())
    deadline = time.monotonic() + 10
    while (read_process(helper_pid) or {}).get("name") != "sleep":
        assert time.monotonic() < deadline, "the Epilog's helper did not start"
        time.sleep(0.01)
    process.helper = read_process(helper_pid)
    yield process
    send_signal(process.helper, signal.SIGKILL)
    process.kill()
    process.wait()


@pytest.fixture
def shm_dir():
    """A folder like /dev/shm (mode 1777), outside pytest's root-only tmp_path."""
    folder = tempfile.mkdtemp(prefix="clusterui-shm-")
    os.chmod(folder, 0o1777)
    yield folder
    shutil.rmtree(folder)




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


def clean(job_id, test_user, shm_dir, epilog, **kwargs):
    """clean_job() for the test user's job, found by /proc, with the stand-in Epilog."""
    args = dict(job_id=job_id, user=test_user.pw_name, job_uid=test_user.pw_uid,
                nvml=FakeNvml(), grace_s=0.5, cgroup_root=NO_CGROUP, shm_dir=shm_dir,
                epilog_pid=epilog.pid)
    return clean_job(**{**args, **kwargs})


def test_clean_job_finds_the_job_by_proc_ends_it_and_removes_the_user_s_shm_files(
        started, test_user, python, job_id, shm_dir, epilog):
    step, daemon = start_job(started, test_user, python, job_id, shm_dir)
    root_helper = start_sleeper(started, job_id=job_id)  # root's, with the job's id
    bystander = start_sleeper(started, job_id=job_id + "1")  # another job's id, longer
    kept, outside = other_users_files(shm_dir, test_user)
    try:
        report = clean(job_id, test_user, shm_dir, epilog, gpus="0")
        assert all(path.exists() for path in kept)
    finally:
        shutil.rmtree(outside)

    assert report["method"] == "proc"
    assert (report["uid"], report["found"]) == (test_user.pw_uid, 2)
    assert sorted(p["pid"] for p in report["processes"]) == sorted([step["pid"], daemon["pid"]])
    for process in report["processes"]:
        assert process["user"] == test_user.pw_name
        assert process["cmdline"].startswith(f"{python} -c ")
        assert len(process["cmdline"]) <= 200
    assert (report["ended"], report["killed"], report["left"]) == (
        [step["pid"]], [daemon["pid"]], [])
    assert (report["ended_count"], report["killed_count"], report["left_count"]) == (1, 1, 0)
    assert (report["unreadable"], report["unreadable_count"]) == ([], 0)
    assert not is_running(step) and not is_running(daemon)
    # Root's process with the job's id, and the Epilog's own helper (the job's user, the
    # job's id), are never the job's.
    assert is_running(root_helper) and is_running(epilog.helper)
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


def test_shm_files_stay_when_another_job_of_the_user_starts_during_the_cleanup(
        started, test_user, python, job_id, shm_dir, epilog):
    """The daemon ignores SIGTERM, so the kill phase takes the grace time; the user's next
    job starts 0.2 s into it. Whether the user has another job is read from /proc right
    before /dev/shm is touched, so its segments stay."""
    start_job(started, test_user, python, job_id, shm_dir)
    next_job = str(int(job_id) + 1)
    starting = threading.Timer(
        0.2, lambda: start_sleeper(started, job_id=next_job, user=test_user))
    starting.start()
    try:
        report = clean(job_id, test_user, shm_dir, epilog, grace_s=1.0)
    finally:
        starting.join()

    reason = f"the user has another job on this node ({next_job})"
    assert (report["found"], report["killed_count"], report["left"]) == (2, 1, [])
    assert (report["shm_removed"], report["shm_skipped"]) == ([], reason)
    assert sorted(os.listdir(shm_dir)) == ["nccl-4821", "torch_4821_0"]
    assert f"{shm_dir} kept: {reason}" in cleanup_event(report)["message"]


def test_shm_files_made_after_the_cleanup_began_are_kept(
        started, test_user, python, job_id, shm_dir, epilog):
    """A segment the user's next job makes during the kill phase (its ctime after the
    clean-up began) stays; the job's older ones go."""
    start_job(started, test_user, python, job_id, shm_dir)
    fresh = Path(shm_dir, "nccl-next-job")

    def next_job_segment():
        fresh.write_bytes(b"x" * 4096)
        os.chown(fresh, test_user.pw_uid, test_user.pw_gid)

    making = threading.Timer(0.2, next_job_segment)
    making.start()
    try:
        report = clean(job_id, test_user, shm_dir, epilog, grace_s=1.0)
    finally:
        making.join()

    assert report["shm_skipped"] is None
    assert sorted(item["path"] for item in report["shm_removed"]) == [
        f"{shm_dir}/nccl-4821/", f"{shm_dir}/nccl-4821/ring0", f"{shm_dir}/torch_4821_0"]
    assert os.listdir(shm_dir) == ["nccl-next-job"]


def test_remove_user_shm_reports_names_that_are_not_utf8_and_takes_deep_trees(
        test_user, shm_dir):
    uid, gid = test_user.pw_uid, test_user.pw_gid
    earlier = time.time_ns()
    odd_name = os.path.join(os.fsencode(shm_dir), b"seg-\xff\xe2\x82")
    with open(odd_name, "wb") as f:
        f.write(b"x" * 10)
    os.chown(odd_name, uid, gid)
    path = shm_dir
    for _ in range(1000):
        path = os.path.join(path, "d")
        os.mkdir(path)
        os.chown(path, uid, gid)
    Path(path, "bottom").write_bytes(b"y")
    os.chown(os.path.join(path, "bottom"), uid, gid)

    # Nothing changed before `earlier`: nothing goes.
    assert remove_user_shm(uid, before_ns=earlier, shm_dir=shm_dir) == []
    removed = remove_user_shm(uid, before_ns=time.time_ns(), shm_dir=shm_dir)

    assert os.listdir(shm_dir) == []
    assert len(removed) == 1 + 1000 + 1
    assert {"path": f"{shm_dir}/seg-\ufffd\ufffd", "bytes": 10} in removed
    assert {"path": shm_dir + "/d" * 1000 + "/bottom", "bytes": 1} in removed
    assert {"path": f"{shm_dir}/d/", "bytes": 0} in removed
    json.dumps(removed, ensure_ascii=False).encode("utf-8")  # no lone surrogate in it


def test_a_user_the_node_does_not_know_has_no_process_ended(started, job_id, shm_dir):
    step = start_sleeper(started, job_id=job_id)
    Path(shm_dir, "segment").write_bytes(b"x")

    report = clean_job(job_id=job_id, user="no-such-user-here", job_uid=None, nvml=None,
                       grace_s=0.1, cgroup_root=NO_CGROUP, shm_dir=shm_dir)

    assert (report["uid"], report["found"], report["processes"]) == (None, 0, [])
    assert is_running(step)
    assert report["shm_skipped"] == "no user no-such-user-here on this node"
    assert os.listdir(shm_dir) == ["segment"]
    assert cleanup_event(report)["message"] == (
        f"job {job_id} (no-such-user-here): no user no-such-user-here on this node: no "
        f"process ended; {shm_dir} kept: no user no-such-user-here on this node; the job had "
        "no GPUs")


def test_the_epilog_itself_its_ancestors_and_its_helpers_are_not_the_job_s(started, job_id):
    """The Epilog runs with the job's SLURM_JOB_ID: a shell with it starts a helper with it
    (as `exec > >(logger)` does) and runs a Python with it, which looks for the job's
    processes (a root job: uid 0)."""
    step = start_sleeper(started, job_id=job_id)
    code = ("import json, os; from agent.hygiene.job_cleanup import find_job_processes; "
            f"method, found, unreadable = find_job_processes({job_id!r}, job_uid=0, "
            f"cgroup_root={NO_CGROUP!r}); "
            "print(json.dumps([os.getpid(), method, [p['pid'] for p in found], unreadable]))")
    shell = subprocess.run(
        ["sh", "-c", f'echo $$; sleep 60 & echo $!; "{sys.executable}" -c "{code}"; kill $!'],
        env={"PATH": os.environ["PATH"], "SLURM_JOB_ID": job_id}, cwd=REPO,
        capture_output=True, text=True, timeout=60, check=True,
    )
    shell_pid, helper_pid, result = shell.stdout.splitlines()
    python_pid, method, pids, unreadable = json.loads(result)

    assert method == "proc"
    assert pids == [step["pid"]]
    assert unreadable == []
    assert step["pid"] not in (int(shell_pid), int(helper_pid), python_pid)


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


def test_a_job_with_a_cgroup_is_found_in_it_and_its_step_cgroups(
        cgroup_root, started, test_user, job_id, epilog):
    job_dir = Path(cgroup_root, f"job_{job_id}")
    (job_dir / "step_0").mkdir(parents=True)
    Path(cgroup_root, "job_1").mkdir()  # another job
    in_job = start_sleeper(started, user=test_user)
    in_step = start_sleeper(started, user=test_user)
    stepd = start_sleeper(started)  # root's, as slurmstepd is: never the job's
    in_other_job = start_sleeper(started, user=test_user)
    (job_dir / "cgroup.procs").write_text(str(in_job["pid"]))
    (job_dir / "step_0" / "cgroup.procs").write_text(str(in_step["pid"]))
    (job_dir / "step_0" / "cgroup.procs").write_text(str(stepd["pid"]))
    Path(cgroup_root, "job_1", "cgroup.procs").write_text(str(in_other_job["pid"]))

    method, found, unreadable = find_job_processes(
        job_id, job_uid=test_user.pw_uid, cgroup_root=cgroup_root, epilog_pid=epilog.pid)

    assert method == "cgroup"
    assert sorted(p["pid"] for p in found) == sorted([in_job["pid"], in_step["pid"]])
    assert all(p["name"] == "sleep" and p["user"] == test_user.pw_name for p in found)
    assert unreadable == []
    assert find_job_processes("2", job_uid=test_user.pw_uid, cgroup_root=cgroup_root) == (
        "proc", [], [])


def test_a_process_in_d_state_is_reported_unreadable_and_never_asked(
        test_user, job_id, shm_dir, tmp_path):
    """Its environ and cmdline are FIFOs nobody writes: reading one would block the test."""
    view = tmp_path / "proc"
    view.mkdir()
    fifos = fake_process(view, FAKE_PID, name=b"python3", state="D", ppid=1,
                         uid=test_user.pw_uid, blocking=("environ", "cmdline"))

    report = finishes(lambda: clean_job(
        job_id=job_id, user=test_user.pw_name, job_uid=test_user.pw_uid, nvml=None,
        grace_s=0.1, cgroup_root=NO_CGROUP, shm_dir=shm_dir, proc=str(view)), fifos)

    assert (report["found"], report["processes"]) == (0, [])
    assert report["unreadable"] == [{"pid": FAKE_PID, "name": "python3",
                                     "user": test_user.pw_name, "start_ticks": 1000}]
    assert report["unreadable_count"] == 1
    assert report["shm_skipped"] is None  # a D-state process says nothing of another job
    assert cleanup_event(report)["message"].startswith(
        f"job {job_id} ({test_user.pw_name}): 0 processes found by /proc, 0 ended, 0 killed, "
        "1 process of the user's in D state not read; ")


@pytest.mark.parametrize("reused", [False, True])
def test_a_pid_reused_while_its_environ_is_read_is_not_taken(test_user, job_id, tmp_path,
                                                             reused):
    """The job's process ends and a new process takes its pid while the search reads the
    environ (a FIFO here, written once the search opens it): the start time read before
    no longer matches, and the pid is left."""
    view = tmp_path / "proc"
    view.mkdir()
    [environ] = fake_process(view, FAKE_PID, name=b"python3", state="S", ppid=1,
                             uid=test_user.pw_uid, blocking=("environ",))

    def write_environ():
        with open(environ, "wb") as fifo:  # opens once the search does
            if reused:
                (view / str(FAKE_PID) / "stat").write_bytes(
                    fake_stat(FAKE_PID, name=b"python3", state="S", ppid=1, start_ticks=2000))
            fifo.write(b"SLURM_JOB_ID=" + job_id.encode() + b"\0")

    writer = threading.Thread(target=write_environ, daemon=True)
    writer.start()
    method, found, unreadable = finishes(lambda: find_job_processes(
        job_id, job_uid=test_user.pw_uid, cgroup_root=NO_CGROUP, proc=str(view)), [environ])
    writer.join(10)

    assert (method, unreadable) == ("proc", [])
    if reused:
        assert found == []
    else:
        assert [(p["pid"], p["start_ticks"]) for p in found] == [(FAKE_PID, 1000)]


def test_a_name_that_is_not_utf8_breaks_nothing(started, test_user, python, job_id, shm_dir,
                                                epilog):
    """A job's process whose comm, cut at 15 bytes, ends in half a character."""
    code = ("import os, time\n"
            "open('/proc/self/comm', 'wb').write(('ab' + '\\u20ac' * 5).encode())\n"
            "print(os.getpid(), flush=True)\n"
            "time.sleep(60)\n")
    process = start(started, [python, "-c", code], job_id=job_id, user=test_user)

    report = clean(job_id, test_user, shm_dir, epilog, grace_s=0.5)

    assert [(p["pid"], p["name"]) for p in report["processes"]] == [
        (process["pid"], "ab" + "\u20ac" * 4 + "\ufffd")]
    assert report["ended"] == [process["pid"]]
    json.dumps(cleanup_event(report), ensure_ascii=False).encode("utf-8")


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


def test_gpu_memory_holders_are_the_job_s_processes_only(started, test_user, job_id):
    ours = start_sleeper(started, job_id=job_id, user=test_user)
    other_job = start_sleeper(started, job_id=job_id + "1", user=test_user)
    adopted = start_sleeper(started, user=test_user)  # no SLURM_JOB_ID (pam_slurm_adopt)
    stranger = start_sleeper(started)  # root's, no SLURM_JOB_ID
    fake = FakeNvml(gpu_count=3)
    fake.add_compute_process(0, ours["pid"])
    fake.add_compute_process(1, other_job["pid"])
    fake.add_compute_process(1, adopted["pid"], used_bytes=None)
    fake.add_compute_process(2, stranger["pid"])
    fake.add_compute_process(2, FAKE_PID)  # gone: one of the job's, ended
    fake.add_compute_process(2, FAKE_PID + 1)  # gone: nothing says whose

    # Found as the job's: FAKE_PID (gone since), and the stranger's pid with another start
    # time (a process before it that had the pid).
    found = [{"pid": FAKE_PID, "start_ticks": 5},
             {"pid": stranger["pid"], "start_ticks": stranger["start_ticks"] - 1}]
    holders = gpu_memory_holders(fake, job_id=job_id, job_uid=test_user.pw_uid,
                                 job_processes=found)

    assert holders == [
        {"pid": ours["pid"], "gpu_index": 0, "gpu_uuid": fake.uuid(0), "gpu_minor": 0,
         "used_memory_bytes": 1002 * MIB, "name": "sleep", "job_id": job_id,
         "start_ticks": ours["start_ticks"]},
        {"pid": adopted["pid"], "gpu_index": 1, "gpu_uuid": fake.uuid(1), "gpu_minor": 1,
         "used_memory_bytes": None, "name": "sleep", "job_id": None,
         "start_ticks": adopted["start_ticks"]},
        {"pid": FAKE_PID, "gpu_index": 2, "gpu_uuid": fake.uuid(2), "gpu_minor": 2,
         "used_memory_bytes": 1002 * MIB, "name": None, "job_id": None, "start_ticks": None},
    ]
    assert [h["pid"] for h in gpu_memory_holders(
        fake, job_id=job_id, job_uid=test_user.pw_uid, gpu_minors={1})] == [adopted["pid"]]

    fake.lost = {0}
    errors = []
    assert [h["pid"] for h in gpu_memory_holders(
        fake, job_id=job_id, job_uid=test_user.pw_uid, gpu_minors={0, 1}, errors=errors)] == [
        adopted["pid"]]
    assert errors == ["GPU 0: GPU is lost"]


def test_the_gpu_check_says_why_it_was_not_made(test_user, job_id, shm_dir):
    args = dict(job_id=job_id, user=test_user.pw_name, job_uid=test_user.pw_uid, gpus="0,1",
                grace_s=0.1, cgroup_root=NO_CGROUP, shm_dir=shm_dir)
    no_driver = clean_job(nvml=FakeNvml(init_error=pynvml.NVMLError_DriverNotLoaded), **args)
    no_pynvml = clean_job(nvml=None, **args)
    lost = FakeNvml(gpu_count=2)
    lost.lost = {1}
    one_lost = clean_job(nvml=lost, **args)
    # A CPU-only job: no GPU is looked at, so even a broken NVML is never asked.
    no_gpus = clean_job(nvml=FakeNvml(init_error=pynvml.NVMLError_DriverNotLoaded),
                        **{**args, "gpus": None})
    empty = clean_job(nvml=FakeNvml(init_error=pynvml.NVMLError_DriverNotLoaded),
                      **{**args, "gpus": ""})

    assert no_driver["gpu_check"] == "NVML unavailable: Driver Not Loaded"
    assert no_pynvml["gpu_check"] == "NVML unavailable: pynvml could not be imported"
    assert one_lost["gpu_check"] == "GPU 1: GPU is lost"
    assert no_gpus["gpu_check"] == empty["gpu_check"] == "the job had no GPUs"
    assert no_driver["gpu_processes"] == no_pynvml["gpu_processes"] == []
    assert no_gpus["gpu_processes"] == []
    assert cleanup_event(no_driver)["message"].endswith("; NVML unavailable: Driver Not Loaded")
    assert cleanup_event(no_gpus)["message"].endswith("; the job had no GPUs")


def holder_of(process, fake, gpu=0):
    """A gpu_memory_holders() entry for `process` (read_process()'s) on the fake's GPU."""
    return {"pid": process["pid"], "gpu_index": gpu, "gpu_uuid": fake.uuid(gpu),
            "gpu_minor": gpu, "used_memory_bytes": 1002 * MIB, "name": process["name"],
            "job_id": None, "start_ticks": process["start_ticks"]}


def test_leftovers_are_recorded_then_announced_and_cleared_by_the_agent(
        started, test_user, job_id, shm_dir, epilog, tmp_path):
    # Holds GPU 1 memory: the job's user's, with no SLURM_JOB_ID (so not ended by /proc).
    stuck = start_sleeper(started, user=test_user)
    fake = FakeNvml(gpu_count=2)
    fake.add_compute_process(1, stuck["pid"])
    report = clean(job_id, test_user, shm_dir, epilog, user="alice", gpus="1", nvml=fake,
                   grace_s=0.1)
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
    assert (second["announced"], second["warning"]["message"]) == (False, warning["message"])

    assert LeftoversWatcher(state_dir=state_dir, nvml=None).check_once() == []
    watcher = LeftoversWatcher(state_dir=state_dir, nvml=fake)
    announced = watcher.check_once()  # the warnings first, as the hook recorded them
    assert announced == [first["warning"], second["warning"]]
    assert [job["announced"] for job in load_leftovers(state_dir)] == [True, True]
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


def test_the_warning_goes_out_before_its_clear_even_when_the_memory_is_freed_first(
        started, tmp_path):
    """The memory is free before the agent's first round: that round announces the warning
    only; the clear comes a round later, so the server never gets it first."""
    holder = start_sleeper(started)
    fake = FakeNvml()
    fake.add_compute_process(0, holder["pid"])
    record_leftovers(tmp_path, {"job_id": "31", "user": "erin",
                                "gpu_processes": [holder_of(holder, fake)]})
    send_signal(holder, signal.SIGKILL)
    fake.compute_processes[0] = []
    watcher = LeftoversWatcher(state_dir=tmp_path, nvml=fake)

    [warning] = watcher.check_once()
    [cleared] = watcher.check_once()

    assert (warning["signature"], warning["state"]) == ("job_leftovers", "active")
    assert (cleared["signature"], cleared["state"]) == ("job_leftovers", "cleared")
    assert cleared["detail"] == {"job_ids": ["31"]}
    assert watcher.check_once() == []


def test_a_job_recorded_while_another_is_cleared_keeps_the_event_open(started, tmp_path):
    freed, held = start_sleeper(started), start_sleeper(started)
    fake = FakeNvml(gpu_count=2)
    fake.add_compute_process(0, freed["pid"])
    fake.add_compute_process(1, held["pid"])
    record_leftovers(tmp_path, {"job_id": "21", "user": "dana",
                                "gpu_processes": [holder_of(freed, fake, 0)]})
    watcher = LeftoversWatcher(state_dir=tmp_path, nvml=fake)
    [_] = watcher.check_once()  # job 21 announced
    send_signal(freed, signal.SIGKILL)
    fake.compute_processes[0] = []
    record_leftovers(tmp_path, {"job_id": "22", "user": "dana",
                                "gpu_processes": [holder_of(held, fake, 1)]})

    [announced] = watcher.check_once()  # 22's warning; 21 forgotten, but 22 keeps it open

    assert announced["detail"]["job_id"] == "22"
    assert [job["job_id"] for job in load_leftovers(tmp_path)] == ["22"]
    assert watcher.check_once() == []
    send_signal(held, signal.SIGKILL)
    fake.compute_processes[1] = []
    [cleared] = watcher.check_once()
    assert cleared["detail"] == {"job_ids": ["22"]}


def test_a_record_from_a_hook_that_announced_it_itself_is_cleared_at_once(started, tmp_path):
    """A record left by the hook before this version (it spooled the warning itself) has
    no `announced` and no warning: it is not announced again."""
    gone = {"pid": FAKE_PID, "start_ticks": 7}
    (tmp_path / "job_leftovers.json").write_text(json.dumps([
        {"job_id": "9", "user": "fay", "pids": [FAKE_PID], "processes": [gone],
         "gpu_uuids": ["GPU-x"], "recorded_at": 1.0}]))

    [cleared] = LeftoversWatcher(state_dir=tmp_path, nvml=FakeNvml()).check_once()

    assert (cleared["state"], cleared["detail"]) == ("cleared", {"job_ids": ["9"]})


def test_a_recorded_pid_taken_by_another_process_holds_nothing(started, tmp_path):
    newcomer = start_sleeper(started)
    fake = FakeNvml()
    fake.add_compute_process(0, newcomer["pid"])
    holder = {**holder_of(newcomer, fake), "start_ticks": newcomer["start_ticks"] - 1}
    record_leftovers(tmp_path, {"job_id": "5", "user": "carol", "gpu_processes": [holder]})
    watcher = LeftoversWatcher(state_dir=tmp_path, nvml=fake)

    [warning] = watcher.check_once()
    [cleared] = watcher.check_once()

    assert warning["state"] == "active"
    assert cleared["detail"] == {"job_ids": ["5"]}


def test_the_events_stay_under_the_detail_limit_with_10000_processes(job_id):
    long_text = "x" * 5000
    processes = [{"pid": pid, "name": "python3", "cmdline": long_text, "user": "alice",
                  "start_ticks": 1} for pid in range(10000)]
    holders = [{"pid": pid, "gpu_index": pid % 8, "gpu_uuid": f"GPU-{pid:036d}",
                "gpu_minor": pid % 8, "used_memory_bytes": MIB, "name": "python3",
                "job_id": job_id, "start_ticks": 1} for pid in range(10000)]
    report = {
        "job_id": job_id, "user": "alice", "uid": 1000, "method": "proc", "found": 10000,
        "processes": processes, "ended": list(range(10000)), "killed": [], "left": [],
        "ended_count": 10000, "killed_count": 0, "left_count": 0,
        "unreadable": [], "unreadable_count": 0,
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
