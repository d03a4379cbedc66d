"""What a Slurm job leaves behind on its node, found and ended when the job ends (the
agent's job-end hook runs it from Slurm's Epilog, as root).

A job's processes are found in Slurm's cgroup for it (cgroup v2:
`<cgroup_root>/job_<id>/` and its step cgroups), or, where the node keeps none, by the
SLURM_JOB_ID in their environment; daemons that left the job's process tree keep both.
Only processes of the job's uid are ever taken for the job's: root's (slurmstepd, the
Epilog's own helpers) never are, whatever their environment says. Nor are the hook's
ancestors, pid 1, or any process descended from the Epilog (the hook's parent): an
Epilog that does `exec > >(logger -t epilog)` has a logger with the job's SLURM_JOB_ID,
and ending it would kill the Epilog with SIGPIPE and drain the node. A process in D
state is never asked for its environment (the read can block on its memory map lock):
found by /proc it is reported as unreadable and left; found in the cgroup it is the
job's and is signalled (SIGKILL takes it once it leaves the kernel).

They get SIGTERM, then SIGKILL after a grace time. Then, for a job that had GPUs
(SLURM_JOB_GPUS), NVML is asked which processes still hold memory on them: one that the
driver cannot free (a process stuck in the kernel) keeps the next job from that memory,
and is recorded so the agent's LeftoversWatcher announces it (job_leftovers) and later
says when it is gone. Last, the user's files in /dev/shm (PyTorch and NCCL segments,
which outlive their processes) are removed, but only those older than the clean-up, and
only when no live process of the user carries another job's SLURM_JOB_ID, checked right
before the removal: a job of the same user starting meanwhile keeps its segments. That
is local evidence only: the Epilog never asks slurmctld (1,000 nodes ending one job
would all ask at once, and SchedMD advises against Slurm commands in an Epilog)."""

import errno
import fcntl
import json
import logging
import os
import signal
import stat
import tempfile
import time

from agent.connection.protocol import counted, event_frame
from agent.detectors.polling import PollingWatcher
from agent.hygiene.processes import (
    is_running,
    read_cmdline,
    read_job_id,
    read_process,
    read_processes,
    send_signal,
    user_name,
    wait_until,
)

log = logging.getLogger(__name__)

DEFAULT_CGROUP_ROOT = "/sys/fs/cgroup/system.slice/slurmstepd.scope"
REPORT_PROCESS_LIMIT = 20
REPORT_LIST_LIMIT = 50
KILL_WAIT_S = 2.0
DETAIL_LIMIT_BYTES = 16 * 1024  # PROTOCOL.md: an event's detail, encoded
LEFTOVERS_FILE = "job_leftovers.json"
MIB = 2**20
NO_GPUS = "the job had no GPUs"


def _ancestors(pid, table, proc):
    """`pid` and every process above it, up to init (pid 1 itself left out)."""
    pids = set()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        info = table.get(pid) or read_process(pid, proc)
        if info is None:
            break
        pid = info["ppid"]
    return pids


def _descends_from(pid, root, table, proc):
    """Whether `root` is `pid` or one of its ancestors. Never for a root of init (pid 1)
    or less: every process descends from init."""
    return root > 1 and root in _ancestors(pid, table, proc)


def _cgroup_pids(job_dir):
    pids = set()
    for folder, _, _ in os.walk(job_dir):  # os.walk does not follow symlinks
        try:
            with open(os.path.join(folder, "cgroup.procs")) as f:
                pids.update(int(line) for line in f if line.strip())
        except FileNotFoundError:  # a step cgroup removed meanwhile
            continue
    return pids


def find_job_processes(job_id, *, job_uid, cgroup_root=DEFAULT_CGROUP_ROOT, proc="/proc",
                       epilog_pid=None):
    """("cgroup" or "proc", processes, unreadable): the processes of Slurm job `job_id`
    still on this node. processes: [{pid, name, cmdline (None for a process in D state:
    not read), user, start_ticks}], each of uid `job_uid` (None: the job's user is not
    known here, so no process is the job's), found in the job's cgroup or, without one,
    by SLURM_JOB_ID=<job_id> in its environment (the start time read before the
    environment and checked unchanged after, so a pid reused meanwhile is not taken).
    unreadable: [{pid, name, user, start_ticks}]: processes of `job_uid` in D state that
    the /proc search could not ask for their environment, so not known to be the job's
    and left alone. Never the hook's own process or its ancestors, pid 1, a kernel
    thread, or a process descended from `epilog_pid` (default this process's parent, the
    Epilog that runs the hook: its own helpers carry the job's SLURM_JOB_ID too)."""
    job_id = str(job_id)
    job_dir = os.path.join(cgroup_root, f"job_{job_id}")
    method = "cgroup" if os.path.isdir(job_dir) else "proc"
    if job_uid is None:
        return method, [], []
    cgroup_pids = _cgroup_pids(job_dir) if method == "cgroup" else None
    table = read_processes(proc)  # stat and status, before any environ is read
    epilog_pid = os.getppid() if epilog_pid is None else epilog_pid
    spared = {1} | _ancestors(os.getpid(), table, proc)
    names = {}
    processes, unreadable = [], []
    for pid in sorted(table if cgroup_pids is None else cgroup_pids):
        info = table.get(pid) or read_process(pid, proc)  # a cgroup pid may be newer
        if (info is None or info["uid"] != job_uid or info["kernel_thread"]
                or pid in spared or _descends_from(pid, epilog_pid, table, proc)):
            continue
        user = user_name(info["uid"], names)
        if method == "proc":
            if info["state"] == "D":
                unreadable.append({"pid": pid, "name": info["name"], "user": user,
                                   "start_ticks": info["start_ticks"]})
                continue
            readable, process_job = read_job_id(info, proc)
            if not readable or process_job != job_id:
                continue
        cmdline = None
        if info["state"] != "D":
            cmdline = read_cmdline(pid, proc)
            if cmdline is None:  # gone meanwhile
                continue
        processes.append({"pid": pid, "name": info["name"], "cmdline": cmdline, "user": user,
                          "start_ticks": info["start_ticks"]})
    return method, processes, unreadable


def end_processes(processes, *, grace_s):
    """SIGTERM each process (if its pid still has the same start time), SIGKILL those
    still running after grace_s. {"ended": pids gone after SIGTERM, "killed": pids gone
    after SIGKILL, "left": pids still running (in the kernel, D state)}."""
    for process in processes:
        send_signal(process, signal.SIGTERM)
    wait_until(lambda: not any(is_running(p) for p in processes), grace_s)
    survivors = [process for process in processes if is_running(process)]
    for process in survivors:
        send_signal(process, signal.SIGKILL)
    wait_until(lambda: not any(is_running(p) for p in survivors), KILL_WAIT_S)
    survivor_pids = {process["pid"] for process in survivors}
    left = [process["pid"] for process in survivors if is_running(process)]
    return {
        "ended": [p["pid"] for p in processes if p["pid"] not in survivor_pids],
        "killed": [p["pid"] for p in survivors if p["pid"] not in left],
        "left": left,
    }


def parse_gpu_minors(text):
    """SLURM_JOB_GPUS ("0,1", "0-3", "0-1,4") as a set of device minor numbers; None
    where none are given or nothing in it is a number."""
    minors = set()
    for token in (text or "").strip().strip("[]").split(","):
        token = token.strip()
        low, _, high = token.partition("-")
        try:
            if high:
                minors.update(range(int(low), int(high) + 1))
            elif low:
                minors.add(int(low))
        except ValueError:
            log.warning("SLURM_JOB_GPUS has %r, which is not a GPU number", token)
    return minors or None


def _compute_processes(nvml, gpu_minors, errors):
    """(gpu, process) for every compute process NVML lists on the GPUs whose minor
    number is in gpu_minors (None: all); gpu is {index, uuid, minor}. A GPU NVML cannot
    read adds a line to `errors` and is skipped."""
    try:
        count = nvml.nvmlDeviceGetCount()
    except nvml.NVMLError as exc:
        errors.append(f"NVML could not count the GPUs: {exc}")
        return []
    found = []
    for index in range(count):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            minor = nvml.nvmlDeviceGetMinorNumber(handle)
            if gpu_minors is not None and minor not in gpu_minors:
                continue
            gpu = {"index": index, "uuid": nvml.nvmlDeviceGetUUID(handle), "minor": minor}
            processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except nvml.NVMLError as exc:
            errors.append(f"GPU {index}: {exc}")
            continue
        found.extend((gpu, process) for process in processes)
    return found


def _gpu_process_of_job(pid, *, job_id, job_uid, job_processes, proc):
    """(whether the process `pid` NVML lists is job `job_id`'s, its read_process() or
    None, its SLURM_JOB_ID or None). It is when it is one of `job_processes` ({pid:
    start_ticks} of those found as the job's: gone since, or with that start time still);
    else when its SLURM_JOB_ID is the job's, or it has none and the job's uid (a rank
    pam_slurm_adopt adopted into the job from an ssh session); one whose environment
    cannot be read (in D state it is not read; a zombie's reads nothing) by its uid."""
    info = read_process(pid, proc)
    if pid in job_processes and (info is None or info["start_ticks"] == job_processes[pid]):
        return True, info, None
    if info is None:
        return False, None, None
    if info["state"] in ("D", "Z", "X"):
        return info["uid"] == job_uid, info, None
    readable, process_job = read_job_id(info, proc)
    if not readable:  # gone or replaced meanwhile
        return False, None, None
    if process_job is not None:
        return process_job == job_id, info, process_job
    return info["uid"] == job_uid, info, None


def gpu_memory_holders(nvml, *, job_id, job_uid, gpu_minors=None, job_processes=(),
                       errors=None, proc="/proc"):
    """The processes of job `job_id` (uid `job_uid`) holding memory on the GPUs with a
    minor number in gpu_minors (None: all): those among job_processes (the job's, as
    find_job_processes() found them: [{pid, start_ticks}], even once gone), those whose
    SLURM_JOB_ID is the job's, or that have none and the job's uid (a D-state process or
    a zombie by its uid alone). Any other process is not this job's.
    [{pid, gpu_index, gpu_uuid, gpu_minor, used_memory_bytes (None where NVML does not
    say), name (None when the process is gone), job_id (its SLURM_JOB_ID where it was
    read, or None), start_ticks}]. NVML must be initialised. A GPU NVML cannot read is
    skipped, with a line in `errors` (a list) where one is given; it is logged too."""
    errors = [] if errors is None else errors
    first_error = len(errors)
    job_id = str(job_id)
    by_pid = {process["pid"]: process["start_ticks"] for process in job_processes}
    holders = []
    for gpu, process in _compute_processes(nvml, gpu_minors, errors):
        ours, info, process_job = _gpu_process_of_job(
            process.pid, job_id=job_id, job_uid=job_uid, job_processes=by_pid, proc=proc)
        if not ours:
            continue
        holders.append({
            "pid": process.pid,
            "gpu_index": gpu["index"],
            "gpu_uuid": gpu["uuid"],
            "gpu_minor": gpu["minor"],
            "used_memory_bytes": process.usedGpuMemory,
            "name": info["name"] if info else None,
            "job_id": process_job,
            "start_ticks": info["start_ticks"] if info else None,
        })
    for error in errors[first_error:]:
        log.warning("GPU memory check of job %s: %s", job_id, error)
    return holders


def other_job_ids(uid, job_id, proc="/proc"):
    """The SLURM_JOB_IDs other than `job_id` that live processes of `uid` carry in their
    environment: the user's other jobs still on this node, as far as /proc shows (no
    Slurm command: the Epilog must not ask slurmctld). Zombies and processes in D state
    (whose environment is not read) are skipped."""
    job_id = str(job_id)
    found = set()
    for info in read_processes(proc).values():
        if info["uid"] != uid or info["state"] in ("Z", "X") or info["kernel_thread"]:
            continue
        readable, process_job = read_job_id(info, proc)
        if readable and process_job is not None and process_job != job_id:
            found.add(process_job)
    return found


def _text(name):
    """A file name as report text: bytes that are not UTF-8 replaced, never a lone
    surrogate (the server refuses an event that holds one)."""
    return os.fsencode(name).decode("utf-8", "replace")


def _remove_owned(top_fd, uid, top_path, before_ns, removed):
    """Remove what `uid` owns under the open directory `top_fd` (at `top_path`) and
    changed last (ctime) before `before_ns` (time.time_ns()): its regular files, and its
    sub-directories once they are empty. Depth first with a stack of open directories,
    not recursion, so a deep tree cannot raise RecursionError (one too deep for this
    process's open files is left below the depth it reached). Every step is relative to
    an open directory and refuses symlinks, so a user who swaps a directory for a
    symlink meanwhile cannot make root remove files elsewhere (as shutil.rmtree does
    it)."""
    stack = [(top_fd, top_path, _listing(top_fd), None)]  # (fd, path, names, dir to rmdir)
    try:
        while stack:
            dir_fd, path, names, rmdir_after = stack[-1]
            if not names:
                stack.pop()
                if rmdir_after is not None:
                    os.close(dir_fd)
                    _remove_dir(stack[-1][0], *rmdir_after, removed)
                continue
            name = names.pop()
            entry_path = path + "/" + _text(name)
            try:
                info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if info.st_uid != uid:
                continue
            if stat.S_ISREG(info.st_mode):
                if info.st_ctime_ns >= before_ns:  # new since the clean-up began: kept
                    continue
                try:
                    os.unlink(name, dir_fd=dir_fd)
                except FileNotFoundError:
                    continue
                removed.append({"path": entry_path, "bytes": info.st_size})
            elif stat.S_ISDIR(info.st_mode):
                try:
                    sub_fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                                     dir_fd=dir_fd)
                except OSError as exc:  # gone, swapped for a symlink, or too many open
                    if exc.errno not in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                        log.warning("cannot open %s: %s", entry_path, exc)
                    continue
                try:
                    names_inside = _listing(sub_fd)
                except OSError as exc:  # too many open files (the listing takes one more)
                    os.close(sub_fd)
                    log.warning("cannot list %s: %s", entry_path, exc)
                    continue
                # Its ctime as it was before anything in it was removed (that changes it).
                old = info.st_ctime_ns < before_ns
                stack.append((sub_fd, entry_path, names_inside, (name, entry_path, old)))
    finally:
        for dir_fd, _, _, rmdir_after in stack:
            if rmdir_after is not None:
                os.close(dir_fd)


def _listing(dir_fd):
    """The names in the open directory, read at once (the listing's own fd closed)."""
    with os.scandir(dir_fd) as entries:
        return [entry.name for entry in entries]


def _remove_dir(parent_fd, name, path, old, removed):
    """rmdir `name` in `parent_fd` when it changed last before the clean-up began (`old`)
    and is empty now; a folder left holding another user's (or newer) files stays."""
    if not old:
        return
    try:
        os.rmdir(name, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
            log.warning("cannot remove %s/: %s", path, exc)
        return
    removed.append({"path": path + "/", "bytes": 0})


def remove_user_shm(uid, *, before_ns, shm_dir="/dev/shm"):
    """Remove the regular files of `uid` in shm_dir whose ctime is before `before_ns`
    (time.time_ns() when the clean-up began: a file made since is a new job's), and the
    directories of theirs that are then empty (and were older too), never following a
    symlink: [{"path", "bytes"}] (a directory's path ends in "/", its bytes are 0; a
    name that is not UTF-8 has its bad bytes replaced)."""
    removed = []
    dir_fd = os.open(shm_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _remove_owned(dir_fd, uid, shm_dir, before_ns, removed)
    finally:
        os.close(dir_fd)
    return removed


def _gpu_check(nvml, job_id, job_uid, gpus, job_processes, proc):
    """(holders, "ok" or why the check is incomplete or was not made)."""
    if not (gpus or "").strip():
        return [], NO_GPUS
    if nvml is None:
        return [], "NVML unavailable: pynvml could not be imported"
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return [], f"NVML unavailable: {exc}"
    try:
        errors = []
        holders = gpu_memory_holders(nvml, job_id=job_id, job_uid=job_uid,
                                     gpu_minors=parse_gpu_minors(gpus),
                                     job_processes=job_processes,
                                     errors=errors, proc=proc)
    finally:
        nvml.nvmlShutdown()
    return holders, "; ".join(errors) or "ok"


SYSTEM_UID_LIMIT = 1000  # Debian's and RHEL's first uid of an ordinary user


def _clean_shm(job_id, user, job_uid, shm_dir, before_ns, proc):
    """(removed, why it was kept or None)."""
    if job_uid is None:
        return [], f"no user {user} on this node"
    if job_uid < SYSTEM_UID_LIMIT:
        # root's and system users' segments are the daemons' (PostgreSQL, NVIDIA's
        # persistenced...), not a job's
        return [], f"{user} is a system user (uid {job_uid})"
    others = other_job_ids(job_uid, job_id, proc)  # right before the removal
    if others:
        return [], f"the user has another job on this node ({', '.join(sorted(others))})"
    return remove_user_shm(job_uid, before_ns=before_ns, shm_dir=shm_dir), None


def clean_job(*, job_id, user, job_uid, gpus=None, nvml, grace_s=10.0,
              cgroup_root=DEFAULT_CGROUP_ROOT, shm_dir="/dev/shm", proc="/proc",
              epilog_pid=None):
    """End what job `job_id` of `user` (uid `job_uid`; None where the node does not know
    the user: then no process is ended and /dev/shm is left alone) left on this node and
    report it (JSON-able). gpus: SLURM_JOB_GPUS (device minor numbers; None or "": the
    job had no GPUs, none is checked; nothing numeric: every GPU is checked); nvml: the
    pynvml module (initialised and shut down here), or None where it cannot be imported;
    epilog_pid: as find_job_processes() takes it."""
    started = time.monotonic()
    started_ns = time.time_ns()
    job_id = str(job_id)
    method, processes, unreadable = find_job_processes(
        job_id, job_uid=job_uid, cgroup_root=cgroup_root, proc=proc, epilog_pid=epilog_pid)
    outcome = end_processes(processes, grace_s=grace_s)
    holders, gpu_check = _gpu_check(nvml, job_id, job_uid, gpus, processes, proc)
    removed, shm_skipped = _clean_shm(job_id, user, job_uid, shm_dir, started_ns, proc)

    return {
        "job_id": job_id,
        "user": user,
        "uid": job_uid,
        "method": method,
        "found": len(processes),
        "processes": processes[:REPORT_PROCESS_LIMIT],
        "ended": sorted(outcome["ended"])[:REPORT_LIST_LIMIT],
        "killed": sorted(outcome["killed"])[:REPORT_LIST_LIMIT],
        "left": sorted(outcome["left"])[:REPORT_LIST_LIMIT],
        "ended_count": len(outcome["ended"]),
        "killed_count": len(outcome["killed"]),
        "left_count": len(outcome["left"]),
        "unreadable": unreadable[:REPORT_LIST_LIMIT],
        "unreadable_count": len(unreadable),
        "gpu_processes": holders,
        "gpu_check": gpu_check,
        "shm_dir": shm_dir,
        "shm_removed": removed[:REPORT_LIST_LIMIT],
        "shm_removed_files": sum(not item["path"].endswith("/") for item in removed),
        "shm_removed_bytes": sum(item["bytes"] for item in removed),
        "shm_skipped": shm_skipped,
        "duration_s": round(time.monotonic() - started, 3),
    }


# Events

def _encoded_size(value):
    return len(json.dumps(value, separators=(",", ":")))


def _fitted_event(detail, **frame_args):
    """An event_frame whose detail, encoded, stays within DETAIL_LIMIT_BYTES."""
    detail = event_frame(detail=detail, **frame_args)["detail"]  # its strings cut as sent
    size = _encoded_size(detail)
    if size > DETAIL_LIMIT_BYTES:
        detail = _lists_cut(detail, size)
    return event_frame(detail=detail, **frame_args)


def _lists_cut(detail, size):
    """`detail` with its largest lists halved until it fits, and `cut`: {name: length
    before} for each list cut. Each item is measured once (10,000 processes are many)."""
    item_sizes = {key: [_encoded_size(item) + 1 for item in value]
                  for key, value in detail.items() if isinstance(value, list)}
    kept = {key: len(sizes) for key, sizes in item_sizes.items()}
    budget = DETAIL_LIMIT_BYTES - 100 * (len(kept) + 1)  # room for `cut`
    while size > budget:
        candidates = [key for key in kept if kept[key] > 0]
        if not candidates:
            raise ValueError("the detail is too large and has no list left to cut")
        key = max(candidates, key=lambda key: sum(item_sizes[key][:kept[key]]))
        half = kept[key] // 2
        size -= sum(item_sizes[key][half:kept[key]])
        kept[key] = half
    fitted = {key: value[:kept[key]] if key in kept else value for key, value in detail.items()}
    fitted["cut"] = {key: len(detail[key]) for key in kept if kept[key] < len(detail[key])}
    return fitted


def _size_text(nbytes):
    if nbytes < MIB:
        return f"{nbytes / 1024:.0f} KiB"
    return f"{nbytes / MIB:.0f} MiB"


def leftovers_event(report):
    """A `job_leftovers` warning: processes still holding GPU memory after the cleanup."""
    holders = report["gpu_processes"]
    total = sum(holder["used_memory_bytes"] or 0 for holder in holders)
    listed = ", ".join(
        f"{holder['name'] or '?'} (pid {holder['pid']}) on GPU {holder['gpu_index']}"
        for holder in holders[:10]
    )
    more = f" and {len(holders) - 10} more" if len(holders) > 10 else ""
    return _fitted_event(
        {"job_id": report["job_id"], "user": report["user"], "gpu_processes": holders},
        signature="job_leftovers",
        severity="warning",
        message=(f"job {report['job_id']} ({report['user']}) left "
                 f"{counted(len(holders), 'process', 'processes')} holding {_size_text(total)} "
                 f"of GPU memory after cleanup: {listed}{more}"),
    )


def cleanup_event(report):
    """A `job_cleanup` info event: what clean_job() found and did."""
    ended, killed, left = report["ended_count"], report["killed_count"], report["left_count"]
    where = "by /proc" if report["method"] == "proc" else "in the job's cgroup"
    if report["uid"] is None:
        parts = [f"no user {report['user']} on this node: no process ended"]
    else:
        parts = [f"{counted(report['found'], 'process', 'processes')} found {where}, "
                 f"{ended} ended, {killed} killed"]
    if left:
        parts[0] += f", {left} still running"
    if report["unreadable_count"]:
        parts[0] += (f", {counted(report['unreadable_count'], 'process', 'processes')} of the "
                     f"user's in D state not read")
    shm_dir = report["shm_dir"]
    if report["shm_skipped"]:
        parts.append(f"{shm_dir} kept: {report['shm_skipped']}")
    else:
        files = report["shm_removed_files"]
        parts.append(f"{counted(files, shm_dir + ' file')} removed "
                     f"({_size_text(report['shm_removed_bytes'])})")
    if report["gpu_processes"]:
        parts.append(f"{counted(len(report['gpu_processes']), 'process', 'processes')} still "
                     f"holding GPU memory")
    elif report["gpu_check"] == "ok":
        parts.append("GPUs clean")
    else:
        parts.append(report["gpu_check"])
    return _fitted_event(
        report,
        signature="job_cleanup",
        severity="info",
        message=f"job {report['job_id']} ({report['user']}): " + "; ".join(parts),
    )


# Leftovers kept across the hook (which records them) and the agent (which announces and
# clears them)

class _Locked:
    """An exclusive flock on <state_dir>/job_leftovers.lock: the hook and the agent are
    two processes that both rewrite the file."""

    def __init__(self, state_dir):
        self.path = os.path.join(state_dir, LEFTOVERS_FILE + ".lock")

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc_info):
        os.close(self.fd)  # closing releases the lock


def load_leftovers(state_dir):
    """The jobs recorded: [{job_id, user, pids, processes: [{pid, start_ticks}],
    gpu_uuids, recorded_at, warning (the job_leftovers event frame), announced}]; [] when
    there is no file (or it is unreadable)."""
    try:
        with open(os.path.join(state_dir, LEFTOVERS_FILE)) as f:
            return json.load(f)
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        log.warning("cannot read %s: %s", LEFTOVERS_FILE, exc)
        return []


def _write_leftovers(state_dir, jobs):
    fd, temp_path = tempfile.mkstemp(dir=state_dir, prefix=LEFTOVERS_FILE + ".")
    try:
        with os.fdopen(fd, "w") as f:  # mkstemp makes it mode 600
            json.dump(jobs, f, indent=1)
        os.replace(temp_path, os.path.join(state_dir, LEFTOVERS_FILE))
    except BaseException:
        os.unlink(temp_path)
        raise


def record_leftovers(state_dir, report):
    """Keep the GPU memory holders of a clean_job() report, with their job_leftovers
    warning (leftovers_event()) not yet announced, beside the jobs recorded before (a job
    recorded again replaces its record, to be announced again). The hook only records:
    the agent's LeftoversWatcher sends the warning, so its `cleared` can never reach the
    server before the warning it clears."""
    holders = report["gpu_processes"]
    if not holders:
        return
    by_pid = {holder["pid"]: holder.get("start_ticks") for holder in holders}
    record = {
        "job_id": str(report["job_id"]),
        "user": report["user"],
        "pids": sorted(by_pid),
        "processes": [{"pid": pid, "start_ticks": by_pid[pid]} for pid in sorted(by_pid)],
        "gpu_uuids": sorted({holder["gpu_uuid"] for holder in holders}),
        "recorded_at": time.time(),
        "warning": leftovers_event(report),
        "announced": False,
    }
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    with _Locked(state_dir):
        jobs = [job for job in load_leftovers(state_dir) if job["job_id"] != record["job_id"]]
        _write_leftovers(state_dir, jobs + [record])


def _announced(job):
    """A record from before the hook left the announcing to the agent has no `announced`:
    that hook spooled its warning itself."""
    return job.get("announced", True)


class LeftoversWatcher(PollingWatcher):
    """Every interval_s seconds, under the file's lock (the hook may be recording): first
    the job_leftovers warning of each job recorded and not yet announced (marked
    announced); then, of the jobs announced in an earlier round, those none of whose
    processes holds GPU memory any more are forgotten, and once no recorded job is left,
    one `cleared` job_leftovers event for them (one event per node: it stays open while
    any job's memory is held). Runs in the agent, where NVML is initialised; with nvml
    None it does nothing. A round where NVML cannot read a GPU clears nothing."""

    thread_name = "job-leftovers"

    def __init__(self, *, state_dir, nvml, interval_s=30.0):
        super().__init__(interval_s)
        self.state_dir = state_dir
        self.nvml = nvml

    def check_once(self):
        if self.nvml is None:
            return []
        if not os.path.exists(os.path.join(self.state_dir, LEFTOVERS_FILE)):
            return []  # nothing ever recorded: no lock file made either
        with _Locked(self.state_dir):
            jobs = load_leftovers(self.state_dir)
            earlier = [job for job in jobs if _announced(job)]
            events = []
            for job in jobs:
                if not _announced(job):
                    events.append(job["warning"])
                    job["announced"] = True
            gone_ids = self._gone(earlier) if earlier else set()
            kept = [job for job in jobs if job["job_id"] not in gone_ids]
            if events or gone_ids:
                _write_leftovers(self.state_dir, kept)
        if gone_ids and not kept:
            events.append(self._cleared([job for job in earlier if job["job_id"] in gone_ids]))
        return events

    def _gone(self, jobs):
        """The ids of the jobs none of whose processes holds GPU memory now; none when
        NVML cannot read a GPU."""
        errors = []
        holding = {process.pid for _, process in _compute_processes(self.nvml, None, errors)}
        if errors:
            log.warning("job leftovers not checked: %s", "; ".join(errors))
            return set()
        return {job["job_id"] for job in jobs if not any(
            self._still_holds(process, holding) for process in job["processes"])}

    @staticmethod
    def _cleared(gone):
        names = ", ".join(f"{job['job_id']} ({job['user']})" for job in gone)
        return event_frame(
            signature="job_leftovers",
            severity="info",
            message=f"the GPU memory left by job{'s' if len(gone) > 1 else ''} {names} is free",
            detail={"job_ids": [job["job_id"] for job in gone]},
            state="cleared",
        )

    @staticmethod
    def _still_holds(recorded, holding):
        """A recorded process holds GPU memory while NVML lists its pid and the pid is
        not another process's by now (a gone pid NVML still lists still holds it)."""
        if recorded["pid"] not in holding:
            return False
        now = read_process(recorded["pid"])
        return now is None or recorded["start_ticks"] in (None, now["start_ticks"])
