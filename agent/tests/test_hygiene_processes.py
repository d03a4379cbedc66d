"""Zombies, orphans and PID usage against real processes on this machine: real zombies
(a parent that forks children which exit and does not wait for them), real orphans (a
setsid double fork, left to init, with an ended job's SLURM_JOB_ID) owned by a throwaway
user, and the real /proc; a /proc of hand-made entries where a process must be one the
kernel would not give a test (D state, unparseable), with FIFOs for the files that must
not be read (a read would block the test). Needs root (to make the user); every process
started here is killed in a finalizer."""

import json
import os
import signal
import subprocess
import threading
import time

import pytest

from agent import host
from agent.connection.protocol import counted, encode
from agent.hygiene import processes
from agent.hygiene.processes import (
    ProcessWatcher,
    clean_up,
    read_process,
    scan,
    send_signal,
)

# Forks N children that exit at once, waits until they are all zombies, then reaps
# whenever a SIGCHLD comes (the children's own SIGCHLDs came before the handler, and
# the default action dropped them), prints the zombies' pids and sleeps.
ZOMBIE_PARENT = r"""
import os, signal, sys, time
children = []
for _ in range(int(sys.argv[1])):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    children.append(pid)
def state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0]
while any(state(pid) != "Z" for pid in children):
    time.sleep(0.01)
def reap(signum, frame):
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
signal.signal(signal.SIGCHLD, reap)
print(" ".join(map(str, children)), flush=True)
while True:
    time.sleep(60)
"""

# A new session, then a fork whose parent exits: the child is left to init. It prints
# its pid once its SIGTERM disposition is set, lets go of stdout, and sleeps.
ORPHAN = r"""
import os, signal, sys, time
os.setsid()
if os.fork():
    os._exit(0)
if sys.argv[1] == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(os.getpid(), flush=True)
devnull = os.open(os.devnull, os.O_RDWR)
os.dup2(devnull, 1)
while True:
    time.sleep(60)
"""

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to make a test user")

ENDED_JOB = "4242"  # the SLURM_JOB_ID of the orphans' job, ended


def no_job_running():
    return set()








def run_as(user, python, code, *args, job_id=None, **popen_args):
    """`python -c code args` as `user`, with SLURM_JOB_ID=job_id where given (and no
    SLURM_JOB_ID otherwise)."""
    env = {key: value for key, value in os.environ.items() if key != "SLURM_JOB_ID"}
    if job_id is not None:
        env["SLURM_JOB_ID"] = job_id
    return subprocess.Popen(
        [python, "-c", code, *args],
        user=user.pw_uid, group=user.pw_gid, extra_groups=[], env=env,
        stdout=subprocess.PIPE, text=True, **popen_args,
    )


def start_zombies(started, user, python, count):
    """(the parent's Popen, the pids of its `count` zombie children)."""
    parent = run_as(user, python, ZOMBIE_PARENT, str(count))
    started.children.append(parent)
    return parent, [int(pid) for pid in parent.stdout.readline().split()]


def start_orphan(started, user, python, ignore_term=False, job_id=ENDED_JOB):
    """A process left to init, with SLURM_JOB_ID=job_id (None: none) in its environment."""
    launcher = run_as(user, python, ORPHAN, "ignore-term" if ignore_term else "exit-on-term",
                      job_id=job_id)
    line = launcher.stdout.readline()
    launcher.wait(timeout=10)
    launcher.stdout.close()
    pid = int(line)
    entry = read_process(pid)
    started.detached.append(entry)
    # It prints its pid before it sleeps: on a busy machine it may still be running (R).
    wait_for(lambda: read_process(pid)["state"] == "S")
    parent = read_process(entry["ppid"])
    if entry["ppid"] != 1 and (parent is None or parent["name"] != "systemd"):
        pytest.skip(f"an orphan here goes to pid {entry['ppid']} (a subreaper), not to init")
    return entry


def wait_for(condition, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def is_zombie(pid):
    info = read_process(pid)
    return info is not None and info["state"] == "Z"


def proc_view(folder, pids):
    """A /proc that shows only `pids` (links to their real /proc/<pid>), with the real
    loadavg and pid_max: the watcher and clean_up() see the test's processes and no
    other, whatever else runs on this machine meanwhile."""
    (folder / "sys" / "kernel").mkdir(parents=True)
    (folder / "loadavg").symlink_to("/proc/loadavg")
    (folder / "sys" / "kernel" / "pid_max").symlink_to("/proc/sys/kernel/pid_max")
    for pid in pids:
        (folder / str(pid)).symlink_to(f"/proc/{pid}")
    return str(folder)


FAKE_PID = 5_000_000  # above any pid_max (2**22): never a real process's pid


def fake_stat(pid, *, name, state, ppid, start_ticks=1000):
    """/proc/<pid>/stat's bytes for a hand-made process (name: bytes, as the kernel has it)."""
    fields = [state, ppid, pid, pid, 0, -1, 0, *[0] * 8, 20, 0, 1, 0, start_ticks, *[0] * 32]
    return f"{pid} (".encode() + name + b") " + " ".join(map(str, fields)).encode() + b"\n"


def fake_process(view, pid, *, name, state, ppid, uid, start_ticks=1000, environ=b"",
                 blocking=()):
    """A hand-made /proc/<pid> in `view`, owned by `uid` as the kernel's is: stat, status,
    and environ and cmdline as files, or, for those named in `blocking`, as FIFOs nobody
    writes (reading one blocks, as reading a D-state process's can). The FIFOs' paths."""
    folder = view / str(pid)
    folder.mkdir()
    os.chown(folder, uid, -1)
    (folder / "stat").write_bytes(fake_stat(pid, name=name, state=state, ppid=ppid,
                                            start_ticks=start_ticks))
    (folder / "status").write_text(f"Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    fifos = []
    for file, content in (("environ", environ), ("cmdline", name + b"\0")):
        if file in blocking:
            os.mkfifo(folder / file)
            fifos.append(folder / file)
        else:
            (folder / file).write_bytes(content)
    return fifos


def finishes(call, fifos, timeout_s=10.0):
    """call()'s result, failing the test if it does not return within timeout_s (it read
    one of `fifos`: those are then opened for writing, to let it go)."""
    result = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        for fifo in fifos:
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # nobody reading this one
                pass
        thread.join(timeout_s)
        pytest.fail(f"blocked reading one of {[str(fifo) for fifo in fifos]}")
    return result[0]


def test_scan_sees_zombies_with_their_parent(started, test_user, python):
    parent, zombie_pids = start_zombies(started, test_user, python, 3)

    report = scan(running_job_ids=no_job_running)

    ours = [zombie for zombie in report.zombies if zombie["pid"] in zombie_pids]
    assert sorted(zombie["pid"] for zombie in ours) == sorted(zombie_pids)
    with open(f"/proc/{parent.pid}/comm") as f:
        parent_name = f.read().strip()
    for zombie in ours:
        assert zombie["ppid"] == parent.pid
        assert zombie["parent_name"] == parent_name
        assert zombie["parent_cmdline"].startswith(f"{python} -c ")
        assert len(zombie["parent_cmdline"]) == 200  # the program is longer: cut
        assert zombie["parent_cmdline"].endswith("…")
        assert zombie["user"] == test_user.pw_name
        assert zombie["start_ticks"] == read_process(zombie["pid"])["start_ticks"]
    assert not {orphan["pid"] for orphan in report.orphans} & set(zombie_pids)
    assert report.summary()["zombies"] == len(report.zombies) >= 3


def test_scan_sees_orphans_of_jobs_not_running_here(started, test_user, python):
    orphan = start_orphan(started, test_user, python)

    [found] = [o for o in scan(running_job_ids=no_job_running).orphans
               if o["pid"] == orphan["pid"]]
    assert found["user"] == test_user.pw_name
    assert found["uid"] == test_user.pw_uid
    assert found["start_ticks"] == orphan["start_ticks"]
    assert found["cmdline"].startswith(f"{python} -c ")
    assert found["state"] == "S"
    assert found["job_id"] == ENDED_JOB

    def orphan_pids(running=set(), **kwargs):
        return {o["pid"] for o in scan(running_job_ids=lambda: running, **kwargs).orphans}

    assert orphan["pid"] not in orphan_pids({ENDED_JOB})  # its job still runs here
    assert orphan["pid"] in orphan_pids({ENDED_JOB + "0", "17"})
    assert orphan["pid"] not in orphan_pids(min_uid=test_user.pw_uid + 1)
    assert orphan["pid"] not in orphan_pids(None)  # Slurm's jobs unknown: never guess


def test_a_user_s_own_process_without_a_job_is_no_orphan(started, test_user, python,
                                                         tmp_path):
    """An admin's tmux or gpg-agent, left to init, carries no SLURM_JOB_ID: it is no job's
    orphan, and with no candidate at all Slurm is not even asked."""
    daemon = start_orphan(started, test_user, python, job_id=None)
    view = proc_view(tmp_path, [daemon["pid"]])
    asked = []

    def running_job_ids():
        asked.append(True)
        return set()

    assert scan(running_job_ids=running_job_ids, proc=view).orphans == []
    assert asked == []
    result = clean_up(running_job_ids=running_job_ids, grace_s=0.1, proc=view)
    assert result["orphans_found"] == 0 and asked == []
    assert processes.is_running(daemon)


def test_running_job_ids_asks_squeue_for_this_node_s_jobs(tmp_path, monkeypatch):
    """A stand-in squeue on PATH that records its arguments and answers two job ids; then
    one that fails."""
    calls = tmp_path / "calls"
    squeue = tmp_path / "squeue"
    squeue.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nprintf "  101\\n102\\n\\n"\n')
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")

    assert host.running_job_ids("gpu-001") == {"101", "102"}
    assert calls.read_text() == (
        "-h -w gpu-001 -t RUNNING,SUSPENDED,COMPLETING,CONFIGURING -o %A\n")

    squeue.write_text("#!/bin/sh\necho 'slurm_load_jobs error: Unable to contact' >&2\nexit 1\n")
    assert host.running_job_ids("gpu-001") is None


def test_a_process_that_is_gone_reads_as_none():
    child = subprocess.Popen(["sleep", "30"])
    assert read_process(child.pid)["name"] == "sleep"
    child.kill()
    child.wait()
    assert read_process(child.pid) is None


def test_summary_counts_every_task_against_pid_max():
    report = scan(running_job_ids=lambda: None)
    summary = report.summary()

    assert set(summary) == {"zombies", "orphans", "tasks", "pid_max"}
    assert all(type(value) is int for value in summary.values())
    with open("/proc/sys/kernel/pid_max") as f:
        assert summary["pid_max"] == int(f.read())
    # Threads, not processes: this process alone counts each of its threads.
    assert summary["tasks"] >= len(processes.process_pids())
    assert report.tasks_by_user["root"] >= read_process(os.getpid())["threads"]


def test_a_signal_is_not_sent_to_a_pid_with_another_start_time():
    child = subprocess.Popen(["sleep", "30"])
    try:
        entry = read_process(child.pid)
        assert not send_signal({**entry, "start_ticks": entry["start_ticks"] + 1},
                               signal.SIGTERM)
        assert child.poll() is None
        assert send_signal(entry, signal.SIGTERM)
        assert child.wait(timeout=10) == -signal.SIGTERM
    finally:
        child.kill()
        child.wait()


def test_the_watcher_opens_and_clears_zombie_processes(started, test_user, python, tmp_path):
    parent, zombie_pids = start_zombies(started, test_user, python, 3)
    view = proc_view(tmp_path, [parent.pid, *zombie_pids])
    watcher = ProcessWatcher(running_job_ids=lambda: None, zombie_threshold=4,
                             pid_pressure_pct=100.0, proc=view)
    assert watcher.status() is None

    # 3 zombies, below 4: the state was unknown (an agent restart), so both are cleared.
    first = watcher.check_once()
    assert [(e["signature"], e["state"]) for e in first] == [
        ("zombie_processes", "cleared"), ("pid_pressure", "cleared")]
    assert first[0]["message"] == "3 zombie processes at agent start, below the threshold 4"
    assert first[0]["detail"] == {"zombies": 3, "threshold": 4}
    assert watcher.check_once() == []  # known now: no edge, no event
    watcher.zombie_threshold = 3
    [opened] = watcher.check_once()
    assert watcher.check_once() == []  # still at the threshold: no new event
    os.kill(parent.pid, signal.SIGCHLD)
    wait_for(lambda: not any(is_zombie(pid) for pid in zombie_pids))
    [cleared] = watcher.check_once()
    assert watcher.check_once() == []

    with open(f"/proc/{parent.pid}/comm") as f:
        parent_name = f.read().strip()
    assert (opened["signature"], opened["severity"], opened["state"], opened["gpu_uuid"]) == (
        "zombie_processes", "warning", "active", None)
    assert opened["message"] == (
        f"3 zombie processes (threshold 3); parents: {parent_name} (pid {parent.pid}) with 3")
    assert opened["detail"]["zombies"] == 3
    assert opened["detail"]["threshold"] == 3
    listed = opened["detail"]["processes"]
    assert sorted(zombie["pid"] for zombie in listed) == sorted(zombie_pids)
    assert listed[0]["ppid"] == parent.pid
    assert listed[0]["parent_name"] == parent_name
    assert listed[0]["user"] == test_user.pw_name
    assert set(listed[0]) == {"pid", "name", "ppid", "parent_name", "parent_cmdline", "user"}
    assert (cleared["signature"], cleared["severity"], cleared["state"]) == (
        "zombie_processes", "info", "cleared")
    assert cleared["detail"] == {"zombies": 0, "threshold": 3}
    encode(opened)
    encode(cleared)

    status = watcher.status()
    assert {key: status[key] for key in ("zombies", "orphans")} == {"zombies": 0, "orphans": 0}
    assert set(status) == {"zombies", "orphans", "tasks", "pid_max", "checked_at"}
    assert abs(status["checked_at"] - time.time()) < 60


def test_the_watcher_opens_and_clears_pid_pressure():
    watcher = ProcessWatcher(running_job_ids=no_job_running, zombie_threshold=10**6,
                             pid_pressure_pct=0.001)
    zombies_cleared, opened = watcher.check_once()
    assert (zombies_cleared["signature"], zombies_cleared["state"]) == (
        "zombie_processes", "cleared")
    assert watcher.check_once() == []
    watcher.pid_pressure_pct = 100.0
    [cleared] = watcher.check_once()

    assert (opened["signature"], opened["severity"], opened["state"]) == (
        "pid_pressure", "warning", "active")
    detail = opened["detail"]
    assert set(detail) == {"tasks", "pid_max", "pct", "threshold_pct", "top_users"}
    assert detail["pct"] == round(detail["tasks"] / detail["pid_max"] * 100, 1)
    assert detail["threshold_pct"] == 0.001
    assert 1 <= len(detail["top_users"]) <= 5
    # The count (/proc/loadavg) and the scan by user are two reads of a machine whose tasks
    # come and go in between (the suite runs beside it): they agree within a few percent.
    assert sum(user["tasks"] for user in detail["top_users"]) <= detail["tasks"] * 1.05
    assert "root" in {user["user"] for user in detail["top_users"]}
    assert opened["message"].startswith(f"{detail['tasks']} tasks of pid_max {detail['pid_max']}")
    assert (cleared["signature"], cleared["severity"], cleared["state"]) == (
        "pid_pressure", "info", "cleared")
    encode(opened)


def test_clean_up_ends_orphans_and_has_zombies_reaped(started, test_user, python, tmp_path):
    polite = start_orphan(started, test_user, python)
    stubborn = start_orphan(started, test_user, python, ignore_term=True)
    parent, zombie_pids = start_zombies(started, test_user, python, 3)
    view = proc_view(tmp_path, [polite["pid"], stubborn["pid"], parent.pid, *zombie_pids])

    result = clean_up(running_job_ids=no_job_running, grace_s=0.5, proc=view)

    assert result["orphans_found"] == 2
    assert result["orphans_ended"] == [polite["pid"]]
    assert result["orphans_killed"] == [stubborn["pid"]]
    assert result["orphans_left"] == []
    assert result["orphans_after"] == 0
    assert not processes.is_running(polite) and not processes.is_running(stubborn)
    assert result["parents_signalled"] == [parent.pid]
    assert not any(is_zombie(pid) for pid in zombie_pids)
    assert result["zombies_before"] == 3
    # The two orphans ended may still have been waiting for init to reap them.
    assert sum(is_zombie(o["pid"]) for o in (polite, stubborn)) <= result["zombies_after"] <= 2
    assert result["message"] == (
        "ended 2 orphaned processes (1 with SIGKILL); signalled 1 parent of 3 zombies; "
        f"{counted(result['zombies_after'], 'zombie')} left")
    json.dumps(result)


def test_clean_up_leaves_the_processes_of_jobs_still_running(started, test_user, python,
                                                             tmp_path):
    orphan = start_orphan(started, test_user, python)
    view = proc_view(tmp_path, [orphan["pid"]])

    result = clean_up(running_job_ids=lambda: {ENDED_JOB}, grace_s=0.5, proc=view)

    assert result["orphans_found"] == 0
    assert processes.is_running(orphan)


def test_a_process_in_d_state_is_never_asked_for_its_environ_or_cmdline(test_user, tmp_path):
    """Reading a D-state process's environ or cmdline can block on its memory map lock: a
    D-state process left to init is no orphan (unknown, and it cannot be ended now), and
    a zombie's D-state parent has no cmdline in the report."""
    view = tmp_path / "proc"
    proc = proc_view(view, [])
    fifos = fake_process(view, FAKE_PID, name=b"python3", state="D", ppid=1,
                         uid=test_user.pw_uid, blocking=("environ", "cmdline"))
    fake_process(view, FAKE_PID + 3, name=b"python3", state="S", ppid=1, uid=test_user.pw_uid,
                 environ=b"SLURM_JOB_ID=" + ENDED_JOB.encode() + b"\0")
    fifos += fake_process(view, FAKE_PID + 1, name=b"trainer", state="D", ppid=1, uid=0,
                          blocking=("environ", "cmdline"))
    fake_process(view, FAKE_PID + 2, name=b"worker", state="Z", ppid=FAKE_PID + 1,
                 uid=test_user.pw_uid)

    report = finishes(lambda: scan(running_job_ids=no_job_running, proc=proc), fifos)

    # The sleeping one beside it, read the same way, is one: the view works.
    assert [orphan["pid"] for orphan in report.orphans] == [FAKE_PID + 3]
    [zombie] = report.zombies
    assert (zombie["pid"], zombie["parent_name"], zombie["parent_cmdline"]) == (
        FAKE_PID + 2, "trainer", None)
    result = finishes(lambda: clean_up(running_job_ids=no_job_running, grace_s=0.1,
                                       proc=proc), fifos)
    assert result["orphans_found"] == 1


def test_a_name_that_is_not_utf8_or_an_unreadable_pid_skips_only_that(
        started, test_user, python, tmp_path):
    """A comm cut at 15 bytes in the middle of a character, and a /proc entry that does
    not parse: the scan goes on, and the name reads with a replacement character."""
    code = ("import os, time\n"
            "open('/proc/self/comm', 'wb').write(('ab' + '\u20ac' * 5).encode())\n"
            "print(os.getpid(), flush=True)\n"
            "time.sleep(60)\n")
    child = run_as(test_user, python, code)
    started.children.append(child)
    pid = int(child.stdout.readline())
    with open(f"/proc/{pid}/comm", "rb") as f:
        assert f.read() == b"ab" + "\u20ac".encode() * 4 + "\u20ac".encode()[:1] + b"\n"
    view = tmp_path / "proc"
    proc = proc_view(view, [pid])
    broken = view / str(FAKE_PID)
    broken.mkdir()
    (broken / "stat").write_bytes(b"garbage")
    (broken / "status").write_bytes(b"Uid:\t0\n")

    info = read_process(pid, proc)
    report = scan(running_job_ids=no_job_running, proc=proc)

    assert info["name"] == "ab" + "\u20ac" * 4 + "\ufffd"
    assert read_process(FAKE_PID, proc) is None
    assert report.tasks_by_user == {test_user.pw_name: 1}
    assert scan(running_job_ids=no_job_running).tasks > 0  # the whole real /proc, too
