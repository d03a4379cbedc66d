"""Node hygiene on a simulated node (--simulate, the demo fleet): the readings and events of a
healthy Slurm node, and the faults --inject names (agent/sim/inject.py), as the real watchers
would report them. Nothing here touches this machine's processes or its Slurm: the readings
say `"watched_by": "simulated"`.

    gres_drift@<s>s     Slurm's view loses the node's last GPU: gres_drift with both lists;
                        the server's `reconfigure` puts it back and it clears
    zombies@<s>s        25 zombies under one parent: zombie_processes; the server's
                        `cleanup` reaps them and it clears
    slurmd_flap@<s>s    slurmd dies three times, 20 s apart: a slurmd_restarted notice for
                        each, slurmd_flapping at the third, cleared after the flap window
    job_leftovers@<s>s  a job ends leaving a process on the GPU: its job_cleanup notice and
                        job_leftovers, which a reboot clears

With `jobs` (the fleet's workload, agent/sim/workload.py), each of the node's jobs is
cleaned up without leftovers when it ends: a job_cleanup notice naming it, as Slurm's
accounting does (the demo fleet's job ends). A simulated reboot ends the
zombies, the leftovers and faults not yet due, and restarts slurmd; a gres.conf drift is
in a file and outlives it.
"""

import random
import time

from agent.connection.protocol import counted, event_frame

ZOMBIES = 25
FLAP_RESTARTS = 3
FLAP_GAP_S = 20.0
FLAP_WINDOW_S = 600.0
PID_MAX = 4194304
TASKS = 2140
LEFTOVER_BYTES = 1002 * 2**20  # the one compute process of the real H200 reading
USERS = ("alice", "bob", "chen", "dana")


class SimulatedHygiene:
    """Polled by the client like a watcher; `status_of(part)` are the sample's readings and
    `run()` carries out the server's cleanup and reconfigure."""

    actions = ("cleanup", "reconfigure")

    def __init__(self, node_name, backend, faults=(), *, jobs=None,
                 flap_window_s=FLAP_WINDOW_S, clock=time.monotonic, wall=time.time, rng=None):
        self.node_name = node_name
        self._backend = backend
        self._faults = [fault for fault in faults if fault.kind in (
            "gres_drift", "zombies", "slurmd_flap", "job_leftovers")]
        self._fired = set()
        self._jobs = jobs
        self._flap_window_s = flap_window_s
        self._clock, self._wall = clock, wall
        self._rng = rng or random.Random(node_name)
        self._started = clock()
        self._reboots = backend.reboots
        self._events = []
        self._slurmd_since = wall()
        self._slurmd_pid = 4000 + self._rng.randrange(1000)
        self._restarts = []  # clock() of each restart
        self._flap_due = []  # clock() of the restarts a slurmd_flap fault has to come
        self._flapping = False
        self._zombies = 0
        self._gres_drift = False
        self._leftover_job = None
        self._jobs_seen_until = wall()
        self._job_id = 10000 + self._rng.randrange(90000)

    # The watcher's side

    def poll(self, readings):
        now = self._clock()
        if self._backend.reboots != self._reboots:
            self._after_reboot(now)
        elapsed = now - self._started
        for number, fault in enumerate(self._faults):
            if number not in self._fired and elapsed >= fault.at_s:
                self._fired.add(number)
                self._start(fault, now)
        self._flap_on(now)
        if self._jobs is not None:
            self._report_ended_jobs()
        events, self._events = self._events, []
        return events

    def close(self):
        pass

    def status_of(self, part):
        checked_at = self._wall()
        if part == "slurmd":
            return {"state": "running", "pid": self._slurmd_pid, "since": self._slurmd_since,
                    "restarts": len(self._restarts),
                    "last_restart_at": self._restart_wall_times()[-1]
                    if self._restarts else None,
                    "watched_by": "simulated", "restart": True}
        if part == "processes":
            return {"zombies": self._zombies, "orphans": 0, "tasks": TASKS + self._zombies,
                    "pid_max": PID_MAX, "checked_at": checked_at}
        # gres.conf names every GPU the node was built with; NVML sees those still on the bus.
        nvml = len(self._backend.gpus())
        slurm = self._backend.gpu_count - (1 if self._gres_drift else 0)
        return {"match": nvml == slurm, "nvml_gpus": nvml, "slurm_gpus": slurm,
                "checked_at": checked_at, "not_compared": None}

    # The commands' side

    async def run(self, action, params, client):
        if action == "cleanup":
            reaped, self._zombies = self._zombies, 0
            if reaped:
                self._events.append(event_frame(
                    signature="zombie_processes", severity="info", state="cleared",
                    message="zombie processes down to 0 (threshold 10)",
                    detail={"zombies": 0, "threshold": 10}))
            return (f"ended 0 orphaned processes (0 with SIGKILL); signalled "
                    f"{counted(1 if reaped else 0, 'parent')} of {counted(reaped, 'zombie')}; "
                    f"0 zombies left")
        gpus = len(self._backend.gpus())
        was_drifting, self._gres_drift = self._gres_drift, False
        if was_drifting:
            self._events.append(event_frame(
                signature="gres_drift", severity="info", state="cleared",
                message=f"Slurm's view of {self.node_name}'s GPUs matches the hardware again",
                detail={}))
        return (f"gres.conf: {self.node_name} Name=gpu File=/dev/nvidia[0-{gpus - 1}]; "
                f"Gres=gpu:{gpus}; Slurm's view matches NVML's {gpus} GPUs")

    # What each fault does

    def _start(self, fault, now):
        if fault.kind == "gres_drift":
            self._gres_drift = True
            self._events.append(self._drift_event())
        elif fault.kind == "zombies":
            self._zombies = ZOMBIES
            self._events.append(self._zombie_event())
        elif fault.kind == "slurmd_flap":
            self._flap_due = [now + i * FLAP_GAP_S for i in range(FLAP_RESTARTS)]
        elif fault.kind == "job_leftovers":
            self._events += self._job_end(*self._last_job(), leftover_gpu=fault.gpu)

    def _flap_on(self, now):
        for due in list(self._flap_due):
            if now >= due:
                self._flap_due.remove(due)
                self._restart(now)
        if self._flapping and self._restarts and now - self._restarts[-1] >= self._flap_window_s:
            self._flapping = False
            self._events.append(event_frame(
                signature="slurmd_flapping", severity="info", state="cleared",
                message=f"slurmd on {self.node_name} has run {self._flap_window_s / 60:g} min "
                        f"without a restart", detail={"window_s": self._flap_window_s}))

    def _restart(self, now):
        ran_for = self._wall() - self._slurmd_since
        previous, self._slurmd_pid = self._slurmd_pid, self._slurmd_pid + 1
        self._slurmd_since = self._wall()
        self._restarts.append(now)
        recent = [at for at in self._restarts if now - at <= self._flap_window_s]
        self._events.append(event_frame(
            signature="slurmd_restarted", severity="info",
            message=f"slurmd on {self.node_name} was not running (pid {previous}, up "
                    f"{ran_for / 60:.0f} min): restarted, now pid {self._slurmd_pid} (restart "
                    f"{len(recent)} in {self._flap_window_s / 60:g} min)",
            detail={"previous_pid": previous, "ran_for_s": round(ran_for, 1),
                    "pid": self._slurmd_pid, "restarts_in_window": len(recent),
                    "window_s": self._flap_window_s, "watched_by": "simulated",
                    "command": "slurmd"}))
        if len(recent) >= FLAP_RESTARTS and not self._flapping:
            self._flapping = True
            self._events.append(event_frame(
                signature="slurmd_flapping", severity="warning",
                message=f"slurmd on {self.node_name} was restarted {len(recent)} times in "
                        f"{self._flap_window_s / 60:g} min",
                detail={"restarts": len(recent), "window_s": self._flap_window_s,
                        "restart_times": self._restart_wall_times()[-len(recent):]}))

    def _restart_wall_times(self):
        offset = self._wall() - self._clock()
        return [round(at + offset, 3) for at in self._restarts]

    def _after_reboot(self, now):
        self._reboots = self._backend.reboots
        self._fired.update(range(len(self._faults)))  # faults not yet due never come
        self._flap_due = []
        self._slurmd_since, self._slurmd_pid = self._wall(), self._slurmd_pid + 100
        if self._zombies:
            self._zombies = 0
            self._events.append(event_frame(
                signature="zombie_processes", severity="info", state="cleared",
                message="zombie processes down to 0 (threshold 10)",
                detail={"zombies": 0, "threshold": 10}))
        if self._leftover_job is not None:
            job, self._leftover_job = self._leftover_job, None
            self._events.append(event_frame(
                signature="job_leftovers", severity="info", state="cleared",
                message=f"the GPU memory left by job {job} is free", detail={"job_ids": [job]}))

    # The events, shaped as the real watchers make them

    def _drift_event(self):
        gpus = self._backend.gpus()
        last = gpus[-1]
        problems = [f"Slurm's Gres says {len(gpus) - 1} GPUs, NVML sees {len(gpus)}",
                    f"gres.conf has no line for /dev/nvidia{last['index']} (GPU "
                    f"{last['index']}, {last['uuid']})"]
        return event_frame(
            signature="gres_drift", severity="warning",
            message=f"Slurm's view of {self.node_name}'s GPUs differs from the hardware: "
                    f"gres.conf names {len(gpus) - 1} GPUs, NVML sees {len(gpus)}",
            detail={"problems": problems,
                    "nvml": [{"index": gpu["index"], "uuid": gpu["uuid"], "minor": gpu["index"],
                              "device": f"/dev/nvidia{gpu['index']}"} for gpu in gpus],
                    "slurm": {"gres": f"gpu:{len(gpus) - 1}", "count": len(gpus) - 1}})

    def _zombie_event(self):
        parent = {"pid": 41877, "name": "python3", "cmdline": "python3 train.py --workers 32"}
        processes = [{"pid": parent["pid"] + 1 + i, "name": "python3", "ppid": parent["pid"],
                      "parent_name": parent["name"], "parent_cmdline": parent["cmdline"],
                      "user": "alice"} for i in range(20)]
        return event_frame(
            signature="zombie_processes", severity="warning",
            message=f"{ZOMBIES} zombie processes (threshold 10); parents: python3 "
                    f"(pid {parent['pid']}) with {ZOMBIES}",
            detail={"zombies": ZOMBIES, "threshold": 10, "processes": processes})

    def _report_ended_jobs(self):
        now = self._wall()
        workload = self._jobs.current()
        for job in workload.ended_on(self.node_name, self._jobs_seen_until, now, now):
            self._events += self._job_end(job.id, job.user, leftover_gpu=None)
        self._jobs_seen_until = now

    def _last_job(self):
        """(id, user) of the node's last job: the workload's latest to end on it, or one
        made up without a workload."""
        if self._jobs is not None:
            now = self._wall()
            ended = self._jobs.current().ended_on(self.node_name, now - 86400, now, now)
            if ended:
                return ended[-1].id, ended[-1].user
        self._job_id += 1 + self._rng.randrange(40)
        return str(self._job_id), self._rng.choice(USERS)

    def _job_end(self, job, user, *, leftover_gpu):
        """A job's job_cleanup notice, and job_leftovers when it left a GPU process."""
        found = self._rng.randint(1, 4)
        shm_bytes = self._rng.choice((0, 64, 256)) * 2**20
        holders = []
        if leftover_gpu is not None:
            gpu = self._backend.gpus()[leftover_gpu]
            holders = [{"pid": 52000 + self._rng.randrange(1000), "gpu_index": gpu["index"],
                        "gpu_uuid": gpu["uuid"], "gpu_minor": gpu["index"],
                        "used_memory_bytes": LEFTOVER_BYTES, "name": "python3", "job_id": job}]
            self._leftover_job = job
        report = {"job_id": job, "user": user, "method": "proc", "found": found,
                  "processes": [], "ended": list(range(found)), "killed": [], "left": [],
                  "ended_count": found, "killed_count": 0, "left_count": 0,
                  "gpu_processes": holders, "gpu_check": "ok",
                  "shm_removed": [{"path": f"/dev/shm/nccl-{job}", "bytes": shm_bytes}]
                  if shm_bytes else [],
                  "shm_removed_bytes": shm_bytes, "shm_removed_files": 1 if shm_bytes else 0,
                  "shm_skipped": None, "shm_dir": "/dev/shm", "duration_s": 0.4}
        gpus = (f"{counted(len(holders), 'process', 'processes')} still holding GPU memory"
                if holders else "GPUs clean")
        notice = event_frame(
            signature="job_cleanup", severity="info",
            message=f"job {job} ({user}): {counted(found, 'process', 'processes')} found by "
                    f"/proc, {found} ended, 0 killed; "
                    f"{counted(report['shm_removed_files'], '/dev/shm file')} removed "
                    f"({shm_bytes // 2**20} MiB); {gpus}",
            detail=report)
        if not holders:
            return [notice]
        return [notice, event_frame(
            signature="job_leftovers", severity="warning",
            message=f"job {job} ({user}) left 1 process holding 1002 MiB of GPU memory after "
                    f"cleanup: python3 (pid {holders[0]['pid']}) on GPU {leftover_gpu}",
            detail={"job_id": job, "user": user, "gpu_processes": holders})]

