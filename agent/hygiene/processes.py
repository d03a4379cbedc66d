"""Zombies, orphans of ended jobs and PID usage on a node, read from /proc, and the
operator's clean-up of them.

A job that ends badly leaves processes behind: children its step forked and never
waited for (zombies, which hold a PID each until their parent reaps them), and daemons
it double-forked, now re-parented to init (orphans, which go on using CPU, memory and
GPUs). Enough of either and the node runs out of PIDs (pid_max) and cannot start the
next job. scan() counts them; ProcessWatcher turns too many zombies, or tasks near
pid_max, into events; clean_up() is what an operator runs to end them.

An orphan here is a process re-parented to init (pid 1) or to a systemd manager, owned by
a user (uid >= min_uid), whose environment carries the SLURM_JOB_ID of a job that is not
running on this node any more. A user's own processes without a SLURM_JOB_ID (an admin's
tmux, dbus, gpg-agent) are never orphans, nor is the user's systemd manager (`systemd
--user` and its `(sd-pam)`, which logind starts and stops). Which jobs run here comes from
Slurm (`running_job_ids`), asked only when some re-parented process carries a
SLURM_JOB_ID, so a clean node never asks; where Slurm cannot say, no process is called an
orphan, because ending a running job's process is far worse than leaving a stray one.

/proc is read as bytes and decoded with errors="replace" (a name cut at 15 bytes may end
mid-character); a pid that cannot be read is skipped, never the whole scan. A process in
D state (uninterruptible, in the kernel) can make reads of its environ and cmdline block
on its memory map lock, so those are never read for one: stat first, then the rest.

Each process keeps its start time (/proc/<pid>/stat field 22, clock ticks after boot),
and a signal is sent only when the pid still has that start time, so a pid reused by a
new process in the meantime is never signalled."""

import logging
import os
import pwd
import signal
import time
from collections import Counter
from dataclasses import dataclass, field

from agent.connection.protocol import counted, event_frame, truncated
from agent.detectors.polling import PollingWatcher

log = logging.getLogger(__name__)

CMDLINE_LIMIT = 200
LIST_LIMIT = 50  # pids in clean_up()'s report
EVENT_PROCESS_LIMIT = 20  # zombies listed in a zombie_processes event
TOP_USERS = 5
POLL_S = 0.05
KILL_WAIT_S = 2.0  # how long a SIGKILLed process may take to go
ZOMBIE_REAP_WAIT_S = 1.0  # how long signalled parents get to reap their zombies

PF_KTHREAD = 0x00200000  # /proc/<pid>/stat flags: a kernel thread
USER_MANAGER_NAMES = ("systemd", "(sd-pam)")
JOB_ID_VARIABLE = b"SLURM_JOB_ID="


def _read_text(path):
    """The file's bytes decoded as UTF-8, undecodable bytes replaced."""
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace")


def read_process(pid, proc="/proc"):
    """What /proc/<pid>/stat says about one process, and whose it is (the owner of
    /proc/<pid>: its effective uid, or root for a process that is not dumpable, such as a
    setuid one: never taken for a user's), as a dict: pid, name, state, ppid, uid, threads,
    start_ticks, kernel_thread. stat never blocks. None when it is gone, went while it was
    read, or cannot be read or parsed (that pid is skipped, never the caller's whole scan).
    One read and one stat a process: a scan of 4,000 costs a core about 0.1 s
    (bench/hygiene_scan.py)."""
    try:
        uid = os.stat(f"{proc}/{pid}").st_uid
        stat = _read_text(f"{proc}/{pid}/stat")
    except OSError:  # gone (ENOENT, ESRCH), or not readable
        return None
    try:
        # "424 (python3) S 1 ...": the name may hold spaces and ")", so split at the last ")".
        head, _, tail = stat.rpartition(")")
        fields = tail.split()  # fields[0] is field 3 of proc(5), the state
        return {
            "pid": int(pid),
            "name": head.partition("(")[2],
            "state": fields[0],
            "ppid": int(fields[1]),
            "uid": uid,
            "threads": int(fields[17]),
            "start_ticks": int(fields[19]),
            "kernel_thread": bool(int(fields[6]) & PF_KTHREAD),
        }
    except (ValueError, IndexError) as exc:
        log.debug("cannot parse /proc/%s/stat or status: %s", pid, exc)
        return None


def read_cmdline(pid, proc="/proc"):
    """The command line, arguments joined by spaces, cut to 200 characters; "" for a
    zombie or a kernel thread, None when the process is gone or it cannot be read. Never
    call it for a process in D state: the read can block on its memory map lock."""
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    text = raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")
    return truncated(text, CMDLINE_LIMIT)


def read_job_id(info, proc="/proc"):
    """(True, its SLURM_JOB_ID or None) for the process `info` (read_process()'s dict,
    read before), or (False, None) when its environment cannot be trusted: it is in D
    state (the environ is then not read: the read can block), it went, or its pid now
    has another start time (the environ read was a new process's)."""
    if info["state"] == "D":
        return False, None
    try:
        with open(f"{proc}/{info['pid']}/environ", "rb") as f:
            variables = f.read().split(b"\0")
    except OSError:
        return False, None
    now = read_process(info["pid"], proc)
    if now is None or now["start_ticks"] != info["start_ticks"]:
        return False, None
    for variable in variables:
        if variable.startswith(JOB_ID_VARIABLE):
            return True, variable[len(JOB_ID_VARIABLE):].decode("utf-8", "replace")
    return True, None  # none (a zombie's environment reads empty)


def process_pids(proc="/proc"):
    return [int(name) for name in os.listdir(proc) if name.isdigit()]


def user_name(uid, cache):
    """The passwd name of `uid`, or the uid as text where it has no entry."""
    if uid not in cache:
        try:
            cache[uid] = pwd.getpwuid(uid).pw_name
        except KeyError:
            cache[uid] = str(uid)
    return cache[uid]


def is_running(entry, proc="/proc"):
    """Whether the process of `entry` (pid and start_ticks) still runs. A zombie has
    ended: only its exit status is left for its parent."""
    now = read_process(entry["pid"], proc)
    return (
        now is not None
        and now["start_ticks"] == entry["start_ticks"]
        and now["state"] not in ("Z", "X")
    )


def send_signal(entry, signum, proc="/proc"):
    """Send `signum` to the process of `entry` if its pid still has the same start time.
    True when it was sent. A pidfd holds on to the process from the start time check to
    the signal, so the pid cannot be reused in between."""
    pid = entry["pid"]
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except OSError:  # a kernel before 5.3: check, then kill, and hope
        pidfd = None
    try:
        now = read_process(pid, proc)
        if now is None or now["start_ticks"] != entry["start_ticks"]:
            return False
        if pidfd is None:
            os.kill(pid, signum)
        else:
            signal.pidfd_send_signal(pidfd, signum)
        return True
    except ProcessLookupError:
        return False
    finally:
        if pidfd is not None:
            os.close(pidfd)


def wait_until(done, timeout_s):
    """Call done() every 50 ms until it is true or timeout_s have passed; its last
    answer."""
    deadline = time.monotonic() + timeout_s
    while not done():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(POLL_S, remaining))
    return True


@dataclass
class ProcessReport:
    """zombies: [{pid, name, ppid, parent_name, parent_cmdline (None where the parent is
    gone or in D state), parent_start_ticks, user, uid, start_ticks}]; orphans: [{pid,
    name, cmdline, ppid, parent_name, user, uid, state, start_ticks, job_id (the ended
    job's SLURM_JOB_ID)}]; tasks: threads on the node, as the kernel counts them against
    pid_max; tasks_by_user: {user: threads}."""

    zombies: list = field(default_factory=list)
    orphans: list = field(default_factory=list)
    tasks: int = 0
    pid_max: int = 0
    tasks_by_user: dict = field(default_factory=dict)

    def summary(self):
        return {
            "zombies": len(self.zombies),
            "orphans": len(self.orphans),
            "tasks": self.tasks,
            "pid_max": self.pid_max,
        }


def read_task_count(proc="/proc"):
    """The 4th field of /proc/loadavg is "running/total"; total counts every thread."""
    with open(f"{proc}/loadavg") as f:
        return int(f.read().split()[3].split("/")[1])


def read_pid_max(proc="/proc"):
    with open(f"{proc}/sys/kernel/pid_max") as f:
        return int(f.read())


def read_processes(proc="/proc"):
    """{pid: read_process()} of every process that could be read."""
    processes = {}
    for pid in process_pids(proc):
        info = read_process(pid, proc)
        if info is not None:
            processes[pid] = info
    return processes


def scan(*, running_job_ids, proc="/proc", min_uid=1000):
    """Every process on the node, read once. running_job_ids: a callable giving the set of
    job ids (strings) running, suspended, completing or configuring on this node, or None
    where Slurm cannot say (then no orphans); it is called only when some re-parented
    process of a user carries a SLURM_JOB_ID (the orphan candidates), so a clean node
    never asks Slurm."""
    processes = read_processes(proc)
    names = {}
    parent_cmdlines = {}  # many zombies often share one parent
    report = ProcessReport(tasks=read_task_count(proc), pid_max=read_pid_max(proc))
    tasks_by_user = Counter()
    candidates = []  # (info, parent_name, job_id)
    for info in processes.values():
        user = user_name(info["uid"], names)
        tasks_by_user[user] += info["threads"]
        parent = processes.get(info["ppid"])
        parent_name = parent["name"] if parent else None
        if info["state"] == "Z":
            ppid = info["ppid"]
            if parent and parent["state"] != "D" and ppid not in parent_cmdlines:
                parent_cmdlines[ppid] = read_cmdline(ppid, proc)
            report.zombies.append({
                "pid": info["pid"],
                "name": info["name"],
                "ppid": ppid,
                "parent_name": parent_name,
                "parent_cmdline": parent_cmdlines.get(ppid),
                "parent_start_ticks": parent["start_ticks"] if parent else None,
                "user": user,
                "uid": info["uid"],
                "start_ticks": info["start_ticks"],
            })
            continue
        if info["kernel_thread"] or info["uid"] < min_uid or info["name"] in USER_MANAGER_NAMES:
            continue
        if info["ppid"] != 1 and parent_name != "systemd":
            continue
        # In D state its environ is not read (it can block); it cannot be ended now anyway.
        readable, job_id = read_job_id(info, proc)
        if readable and job_id is not None:
            candidates.append((info, parent_name, job_id))
    report.tasks_by_user = dict(tasks_by_user)
    if candidates:
        report.orphans = _orphans(candidates, running_job_ids(), names, proc)
    return report


def _orphans(candidates, running, names, proc):
    """The candidates whose job is not among `running` (None: unknown, no orphans)."""
    if running is None:
        return []
    orphans = []
    for info, parent_name, job_id in candidates:
        if job_id in running:
            continue
        cmdline = read_cmdline(info["pid"], proc)
        if cmdline is None:  # it went meanwhile
            continue
        orphans.append({
            "pid": info["pid"],
            "name": info["name"],
            "cmdline": cmdline,
            "ppid": info["ppid"],
            "parent_name": parent_name,
            "user": user_name(info["uid"], names),
            "uid": info["uid"],
            "state": info["state"],
            "start_ticks": info["start_ticks"],
            "job_id": job_id,
        })
    return orphans


def clean_up(*, running_job_ids, grace_s=10.0, proc="/proc"):
    """The operator's clean-up: SIGTERM every orphan, SIGCHLD every zombie's parent (so
    a parent that reaps on SIGCHLD does), SIGKILL the orphans still there after grace_s,
    and scan again. running_job_ids: as scan() takes it. A JSON-able report with a
    one-line `message`."""
    before = scan(running_job_ids=running_job_ids, proc=proc)
    orphan_pids = {orphan["pid"] for orphan in before.orphans}
    for orphan in before.orphans:
        send_signal(orphan, signal.SIGTERM, proc)

    parents = {}
    for zombie in before.zombies:
        ppid = zombie["ppid"]
        if ppid == 1 or ppid in orphan_pids or zombie["parent_start_ticks"] is None:
            continue
        parents[ppid] = {"pid": ppid, "start_ticks": zombie["parent_start_ticks"]}
    signalled = [pid for pid, parent in parents.items()
                 if send_signal(parent, signal.SIGCHLD, proc)]

    wait_until(lambda: not any(is_running(o, proc) for o in before.orphans), grace_s)
    survivors = [orphan for orphan in before.orphans if is_running(orphan, proc)]
    killed = [orphan for orphan in survivors if send_signal(orphan, signal.SIGKILL, proc)]
    wait_until(lambda: not any(is_running(o, proc) for o in killed), KILL_WAIT_S)
    left = [orphan["pid"] for orphan in before.orphans if is_running(orphan, proc)]
    killed_pids = [orphan["pid"] for orphan in killed if orphan["pid"] not in left]
    survivor_pids = {orphan["pid"] for orphan in survivors}
    ended = [pid for pid in orphan_pids if pid not in survivor_pids]

    zombie_pids_of_signalled = {z["pid"] for z in before.zombies if z["ppid"] in signalled}

    def zombies_reaped():
        return not any(
            (info := read_process(pid, proc)) is not None and info["state"] == "Z"
            for pid in zombie_pids_of_signalled
        )

    wait_until(zombies_reaped, ZOMBIE_REAP_WAIT_S)
    after = scan(running_job_ids=running_job_ids, proc=proc)

    ended_count = len(ended) + len(killed_pids)
    message = (
        f"ended {counted(ended_count, 'orphaned process', 'orphaned processes')} "
        f"({len(killed_pids)} with SIGKILL); signalled "
        f"{counted(len(signalled), 'parent')} of {counted(len(before.zombies), 'zombie')}; "
        f"{counted(len(after.zombies), 'zombie')} left"
    )
    if left:
        message += f"; {len(left)} orphans could not be ended (pids {_pid_list(left)})"
    return {
        "orphans_found": len(before.orphans),
        "orphans_ended": sorted(ended)[:LIST_LIMIT],
        "orphans_killed": sorted(killed_pids)[:LIST_LIMIT],
        "orphans_left": sorted(left)[:LIST_LIMIT],
        "parents_signalled": sorted(signalled)[:LIST_LIMIT],
        "zombies_before": len(before.zombies),
        "zombies_after": len(after.zombies),
        "orphans_after": len(after.orphans),
        "message": message,
    }


def _pid_list(pids, limit=10):
    shown = ", ".join(str(pid) for pid in sorted(pids)[:limit])
    return shown + (", …" if len(pids) > limit else "")


class ProcessWatcher(PollingWatcher):
    """Scans every interval_s seconds. Opens `zombie_processes` when the node holds
    zombie_threshold zombies or more, and `pid_pressure` when its tasks reach
    pid_pressure_pct percent of pid_max; each is cleared when it drops below. Only these
    edges are events, but the state is unknown when the watcher starts (the agent may
    have restarted with either signal open on the server), so the first scan that finds
    one below its threshold sends its `cleared` (the server ignores a clear with nothing
    open). status() gives the latest scan's summary to the agent's sample.
    running_job_ids: as scan() takes it."""

    thread_name = "processes"

    def __init__(self, *, running_job_ids, interval_s=30.0, zombie_threshold=10,
                 pid_pressure_pct=80.0, proc="/proc"):
        super().__init__(interval_s)
        self.running_job_ids = running_job_ids
        self.zombie_threshold = zombie_threshold
        self.pid_pressure_pct = pid_pressure_pct
        self.proc = proc
        self._zombies_open = None  # None: unknown (not scanned yet); then True or False
        self._pressure_open = None
        self._status = None

    def status(self):
        """{"zombies", "orphans", "tasks", "pid_max", "checked_at"} of the latest scan, or
        None before the first."""
        return self._status

    def check_once(self):
        report = scan(running_job_ids=self.running_job_ids, proc=self.proc)
        self._status = {**report.summary(), "checked_at": time.time()}
        return self._zombie_events(report) + self._pressure_events(report)

    def _zombie_events(self, report):
        count = len(report.zombies)
        is_high = count >= self.zombie_threshold
        if is_high == self._zombies_open:
            return []
        known = self._zombies_open is not None
        self._zombies_open = is_high
        if not is_high:
            message = (f"zombie processes down to {count} (threshold {self.zombie_threshold})"
                       if known else
                       f"{counted(count, 'zombie process', 'zombie processes')} at agent "
                       f"start, below the threshold {self.zombie_threshold}")
            return [event_frame(
                signature="zombie_processes",
                severity="info",
                message=message,
                detail={"zombies": count, "threshold": self.zombie_threshold},
                state="cleared",
            )]
        by_parent = Counter((z["parent_name"], z["ppid"]) for z in report.zombies)
        parents = ", ".join(
            f"{name or '?'} (pid {ppid}) with {n}" for (name, ppid), n in by_parent.most_common(10)
        )
        listed = [
            {key: zombie[key] for key in
             ("pid", "name", "ppid", "parent_name", "parent_cmdline", "user")}
            for zombie in report.zombies[:EVENT_PROCESS_LIMIT]
        ]
        return [event_frame(
            signature="zombie_processes",
            severity="warning",
            message=(f"{count} zombie processes (threshold {self.zombie_threshold}); "
                     f"parents: {parents}"),
            detail={"zombies": count, "threshold": self.zombie_threshold, "processes": listed},
        )]

    def _pressure_events(self, report):
        pct = round(report.tasks / report.pid_max * 100, 1)
        is_high = report.tasks / report.pid_max * 100 >= self.pid_pressure_pct
        if is_high == self._pressure_open:
            return []
        known = self._pressure_open is not None
        self._pressure_open = is_high
        detail = {
            "tasks": report.tasks,
            "pid_max": report.pid_max,
            "pct": pct,
            "threshold_pct": self.pid_pressure_pct,
        }
        if not is_high:
            message = (f"tasks down to {report.tasks} of pid_max {report.pid_max} ({pct}%)"
                       if known else
                       f"{report.tasks} tasks of pid_max {report.pid_max} ({pct}%) at agent "
                       f"start, below the threshold {self.pid_pressure_pct:g}%")
            return [event_frame(
                signature="pid_pressure",
                severity="info",
                message=message,
                detail=detail,
                state="cleared",
            )]
        top = Counter(report.tasks_by_user).most_common(TOP_USERS)
        detail["top_users"] = [{"user": user, "tasks": tasks} for user, tasks in top]
        most = ", ".join(f"{user} {tasks}" for user, tasks in top)
        return [event_frame(
            signature="pid_pressure",
            severity="warning",
            message=(f"{report.tasks} tasks of pid_max {report.pid_max} ({pct}%, threshold "
                     f"{self.pid_pressure_pct:g}%); most: {most}"),
            detail=detail,
        )]
