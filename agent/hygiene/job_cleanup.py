"""What a Slurm job leaves behind on its node, found and ended when the job ends (the
agent's job-end hook runs it from Slurm's Epilog, as root).

A job's processes are found in Slurm's cgroup for it (cgroup v2:
`<cgroup_root>/job_<id>/` and its step cgroups), or, where the node keeps none, by the
SLURM_JOB_ID in their environment; daemons that left the job's process tree keep both.
They get SIGTERM, then SIGKILL after a grace time. Then NVML is asked which processes
still hold memory on the job's GPUs: one that the driver cannot free (a process stuck in
the kernel) keeps the next job from that memory, and is recorded so the agent's
LeftoversWatcher can say when it is gone. Last, the user's files in /dev/shm (PyTorch and
NCCL segments, which outlive their processes) are removed, but only when the user has
no other job on the node, which could be using them.

The Epilog itself runs with the job's SLURM_JOB_ID in its environment, so the calling
process and its ancestors are never taken for the job's; nor is pid 1."""

import errno
import fcntl
import json
import logging
import os
import pwd
import signal
import stat
import tempfile
import time

from agent.detectors.polling import PollingWatcher
from agent.hygiene.processes import (
    read_cmdline,
    read_process,
    is_running,
    process_pids,
    send_signal,
    user_name,
    wait_until,
)
from agent.protocol import counted, event_frame

log = logging.getLogger(__name__)

DEFAULT_CGROUP_ROOT = "/sys/fs/cgroup/system.slice/slurmstepd.scope"
REPORT_PROCESS_LIMIT = 20
REPORT_LIST_LIMIT = 50
KILL_WAIT_S = 2.0
DETAIL_LIMIT_BYTES = 16 * 1024  # PROTOCOL.md: an event's detail, encoded
LEFTOVERS_FILE = "job_leftovers.json"
MIB = 2**20


def _process_entry(pid, proc, names):
    info = read_process(pid, proc)
    if info is None:
        return None
    cmdline = read_cmdline(pid, proc)
    if cmdline is None:
        return None
    return {
        "pid": info["pid"],
        "name": info["name"],
        "cmdline": cmdline,
        "user": user_name(info["uid"], names),
        "start_ticks": info["start_ticks"],
    }


def _self_and_ancestors(proc):
    pids = set()
    pid = os.getpid()
    while pid > 0 and pid not in pids:
        pids.add(pid)
        info = read_process(pid, proc)
        if info is None:
            break
        pid = info["ppid"]
    return pids


def environ_job_id(pid, proc="/proc"):
    """The SLURM_JOB_ID in the process's environment (as it was started), or None when
    it has none or cannot be read (gone)."""
    try:
        with open(f"{proc}/{pid}/environ", "rb") as f:
            variables = f.read().split(b"\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    for variable in variables:
        if variable.startswith(b"SLURM_JOB_ID="):
            return variable[len(b"SLURM_JOB_ID="):].decode("utf-8", "replace")
    return None


def _cgroup_pids(job_dir):
    pids = set()
    for folder, _, _ in os.walk(job_dir):  # os.walk does not follow symlinks
        try:
            with open(os.path.join(folder, "cgroup.procs")) as f:
                pids.update(int(line) for line in f if line.strip())
        except FileNotFoundError:  # a step cgroup removed meanwhile
            continue
    return pids


def find_job_processes(job_id, *, cgroup_root=DEFAULT_CGROUP_ROOT, proc="/proc"):
    """("cgroup" or "proc", [{pid, name, cmdline, user, start_ticks}]): the processes of
    Slurm job `job_id` still on this node."""
    job_dir = os.path.join(cgroup_root, f"job_{job_id}")
    if os.path.isdir(job_dir):
        method, pids = "cgroup", _cgroup_pids(job_dir)
    else:
        wanted = str(job_id)
        method = "proc"
        pids = {pid for pid in process_pids(proc) if environ_job_id(pid, proc) == wanted}
    pids -= {1} | _self_and_ancestors(proc)
    names = {}
    entries = [_process_entry(pid, proc, names) for pid in sorted(pids)]
    return method, [entry for entry in entries if entry is not None]


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
    where none are given or nothing in it is a number (then every GPU is checked)."""
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


def gpu_memory_holders(nvml, *, job_id, gpu_minors=None, errors=None):
    """The processes holding memory on the GPUs (those with a minor number in
    gpu_minors; None: all), but for those of another Slurm job (by their environment),
    which is still running: [{pid, gpu_index, gpu_uuid, gpu_minor, used_memory_bytes
    (None where NVML does not say), name (None when the process is gone), job_id (its
    SLURM_JOB_ID, or None), start_ticks}]. NVML must be initialised. A GPU NVML cannot
    read is skipped, with a line in `errors` (a list) where one is given; it is logged
    too."""
    errors = [] if errors is None else errors
    first_error = len(errors)
    holders = []
    for gpu, process in _compute_processes(nvml, gpu_minors, errors):
        process_job = environ_job_id(process.pid)
        if process_job is not None and process_job != str(job_id):
            continue
        info = read_process(process.pid)
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


def _remove_owned(dir_fd, uid, path, removed):
    """Remove the files owned by `uid` in the open directory `dir_fd` (at `path`), and
    its sub-directories owned by `uid` once they are empty. Every step is relative to an
    open directory and refuses symlinks, so a user who swaps a directory for a symlink
    meanwhile cannot make root remove files elsewhere (as shutil.rmtree does it)."""
    for entry in list(os.scandir(dir_fd)):
        try:
            info = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        if info.st_uid != uid:
            continue
        entry_path = os.path.join(path, entry.name)
        if stat.S_ISREG(info.st_mode):
            try:
                os.unlink(entry.name, dir_fd=dir_fd)
            except FileNotFoundError:
                continue
            removed.append({"path": entry_path, "bytes": info.st_size})
        elif stat.S_ISDIR(info.st_mode):
            try:
                sub_fd = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                                 dir_fd=dir_fd)
            except OSError:  # gone, or swapped for a symlink
                continue
            try:
                _remove_owned(sub_fd, uid, entry_path, removed)
            finally:
                os.close(sub_fd)
            try:
                os.rmdir(entry.name, dir_fd=dir_fd)
            except OSError as exc:  # not empty: it holds another user's files
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                    raise
                continue
            removed.append({"path": entry_path + "/", "bytes": 0})


def remove_user_shm(user, *, shm_dir="/dev/shm"):
    """Remove the regular files of `user` in shm_dir, and the directories of theirs that
    are then empty, never following a symlink: [{"path", "bytes"}] (a directory's path
    ends in "/", its bytes are 0). KeyError for a user this node does not know."""
    uid = pwd.getpwnam(user).pw_uid
    removed = []
    dir_fd = os.open(shm_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _remove_owned(dir_fd, uid, shm_dir, removed)
    finally:
        os.close(dir_fd)
    return removed


def _gpu_check(nvml, job_id, gpu_minors):
    """(holders, "ok" or why the check is incomplete)."""
    if nvml is None:
        return [], "NVML unavailable: pynvml could not be imported"
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return [], f"NVML unavailable: {exc}"
    try:
        errors = []
        holders = gpu_memory_holders(nvml, job_id=job_id, gpu_minors=gpu_minors,
                                     errors=errors)
    finally:
        nvml.nvmlShutdown()
    return holders, "; ".join(errors) or "ok"


def clean_job(*, job_id, user, gpus=None, user_has_other_jobs, nvml, grace_s=10.0,
              cgroup_root=DEFAULT_CGROUP_ROOT, shm_dir="/dev/shm", proc="/proc"):
    """End what job `job_id` of `user` left on this node and report it (JSON-able).
    gpus: SLURM_JOB_GPUS (device minor numbers; None or "": check every GPU);
    user_has_other_jobs: True, False or None (unknown: /dev/shm is left alone); nvml:
    the pynvml module (initialised and shut down here), or None where it cannot be
    imported."""
    started = time.monotonic()
    job_id = str(job_id)
    method, processes = find_job_processes(job_id, cgroup_root=cgroup_root, proc=proc)
    outcome = end_processes(processes, grace_s=grace_s)
    holders, gpu_check = _gpu_check(nvml, job_id, parse_gpu_minors(gpus))

    removed, shm_skipped = [], None
    if user_has_other_jobs is None:
        shm_skipped = "unknown whether the user has another job"
    elif user_has_other_jobs:
        shm_skipped = "the user has another job on this node"
    else:
        try:
            removed = remove_user_shm(user, shm_dir=shm_dir)
        except KeyError:
            shm_skipped = f"no user {user} on this node"

    return {
        "job_id": job_id,
        "user": user,
        "method": method,
        "found": len(processes),
        "processes": processes[:REPORT_PROCESS_LIMIT],
        "ended": sorted(outcome["ended"])[:REPORT_LIST_LIMIT],
        "killed": sorted(outcome["killed"])[:REPORT_LIST_LIMIT],
        "left": sorted(outcome["left"])[:REPORT_LIST_LIMIT],
        "ended_count": len(outcome["ended"]),
        "killed_count": len(outcome["killed"]),
        "left_count": len(outcome["left"]),
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
    parts = [f"{counted(report['found'], 'process', 'processes')} found {where}, {ended} ended, "
             f"{killed} killed"]
    if left:
        parts[0] += f", {left} still running"
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


# Leftovers kept across the hook (which records them) and the agent (which clears them)

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
    gpu_uuids, recorded_at}]; [] when there is no file (or it is unreadable)."""
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
    """Keep the GPU memory holders of a clean_job() report, beside the jobs recorded
    before (a job recorded again replaces its record)."""
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
    }
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    with _Locked(state_dir):
        jobs = [job for job in load_leftovers(state_dir) if job["job_id"] != record["job_id"]]
        _write_leftovers(state_dir, jobs + [record])


def forget_leftovers(state_dir, job_ids):
    with _Locked(state_dir):
        jobs = [job for job in load_leftovers(state_dir) if job["job_id"] not in job_ids]
        _write_leftovers(state_dir, jobs)


class LeftoversWatcher(PollingWatcher):
    """Every interval_s seconds, for each job recorded by the job-end hook: once none of
    its processes holds GPU memory any more, a `cleared` job_leftovers event, and the job
    is forgotten. Runs in the agent, where NVML is initialised; with nvml None it does
    nothing. A round where NVML cannot read a GPU clears nothing."""

    thread_name = "job-leftovers"

    def __init__(self, *, state_dir, nvml, interval_s=30.0):
        super().__init__(interval_s)
        self.state_dir = state_dir
        self.nvml = nvml

    def check_once(self):
        if self.nvml is None:
            return []
        jobs = load_leftovers(self.state_dir)
        if not jobs:
            return []
        errors = []
        holding = {process.pid for _, process in _compute_processes(self.nvml, None, errors)}
        if errors:
            log.warning("job leftovers not checked: %s", "; ".join(errors))
            return []
        gone = [job for job in jobs if not any(
            self._still_holds(process, holding) for process in job["processes"])]
        if not gone:
            return []
        forget_leftovers(self.state_dir, {job["job_id"] for job in gone})
        if len(gone) < len(jobs):
            return []  # one job_leftovers event per node: it stays open while any job's does
        names = ", ".join(f"{job['job_id']} ({job['user']})" for job in gone)
        return [
            event_frame(
                signature="job_leftovers",
                severity="info",
                message=f"the GPU memory left by job{'s' if len(gone) > 1 else ''} {names} is free",
                detail={"job_ids": [job["job_id"] for job in gone]},
                state="cleared",
            )
        ]

    @staticmethod
    def _still_holds(recorded, holding):
        """A recorded process holds GPU memory while NVML lists its pid and the pid is
        not another process's by now (a gone pid NVML still lists still holds it)."""
        if recorded["pid"] not in holding:
            return False
        now = read_process(recorded["pid"])
        return now is None or recorded["start_ticks"] in (None, now["start_ticks"])
