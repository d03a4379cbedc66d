"""The Slurm scheduler: drain, resume and read a node, list and requeue its jobs, through
scontrol and squeue with a time limit on every call.

    scheduler = SlurmScheduler(slurm_conf="/etc/slurm/slurm.conf", timeout_s=15)
    scheduler.drain("gpu-001", "clusterui repair #12")
    scheduler.node("gpu-001")          # SchedulerNode(state="MIXED+DRAIN", drained=True, ...)
    scheduler.running_jobs("gpu-001")  # [Job(id="41", user="alice", gpus=12, nodes=(...))]
    scheduler.signal("gpu-001", jobs, "USR1")   # scancel --signal=USR1 --batch 41
    scheduler.stop("gpu-001", jobs)             # requeue 41, or cancel it if it cannot be
    scheduler.resume("gpu-001")

Drain and resume change node state, which Slurm allows root (or SlurmUser) only; the
read-only calls work as any user. Commands run with SLURM_CONF=slurm_conf when given.
"""

import os
import re
import subprocess
import time

from .base import ExecutorError, Job, SchedulerNode

DEFAULT_TIMEOUT_S = 15
# How often requeue() looks whether the jobs it requeued have left COMPLETING.
REQUEUE_POLL_S = 0.2

# A key of `scontrol show node -o`: a word followed by "=" at the start or after a space.
_NODE_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")
# Slurm appends who set a reason and when: "disk full [root@2025-01-31T10:00:00]".
_REASON_SUFFIX = re.compile(r"\s*\[[^\[\]]*@[^\[\]]*\]$")
# squeue -O fields with "|" as their suffix and no width: printed whole, unpadded. The
# job name comes last because it may itself hold "|".
_SQUEUE_JOB_FORMAT = ("JobID:|,UserName:|,Account:|,TimeUsed:|,NumNodes:|,NodeList:|,"
                      "tres-alloc:|,TimeLeft:|,BatchFlag:|,Requeue:|,Name:|")
# Job states of a job still on its nodes: `scontrol requeue` puts these back to pending.
_ON_ITS_NODES = {"RUNNING", "SUSPENDED"}


def parse_node_line(line):
    """The fields of one `scontrol show node <name> -o` line as {key: value}.

    A value runs to the next key, so values with spaces (OS=Linux 6.1 #1 SMP) stay whole.
    Reason comes last and is free text (it may hold "x=y"), so everything after
    " Reason=" is the reason, with Slurm's "[user@time]" suffix removed.
    """
    line = line.strip()
    head, found, reason = line.partition(" Reason=")
    matches = list(_NODE_KEY.finditer(head))
    fields = {}
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(head)
        fields[match.group(1)] = head[match.end():end].strip()
    if found:
        fields["Reason"] = _REASON_SUFFIX.sub("", reason.strip())
    return fields


def node_from_fields(fields):
    """A SchedulerNode from parse_node_line()'s fields. State is Slurm's, e.g. "IDLE",
    "MIXED+DRAIN", "IDLE+NOT_RESPONDING"; drained means the DRAIN flag is set."""
    state = fields.get("State", "")
    flags = state.split("+")
    return SchedulerNode(state=state, drained="DRAIN" in flags, reason=fields.get("Reason", ""))


def parse_run_time(text):
    """squeue's TimeUsed ("5:02", "1:05:02", "2-01:05:02") in seconds; None if not that."""
    days, _, clock = text.strip().rpartition("-")
    parts = clock.split(":")
    try:
        numbers = [int(p) for p in parts]
        total_days = int(days) if days else 0
    except ValueError:
        return None
    if not 1 <= len(numbers) <= 3:
        return None
    seconds = 0
    for number in numbers:
        seconds = seconds * 60 + number
    return total_days * 86400 + seconds


def gpus_from_tres(tres):
    """The GPUs in a TRES list ("cpu=1,node=1,gres/gpu=2", typed ones "gres/gpu:h100=2"
    counted too); 0 when it names none."""
    untyped = 0
    typed = 0
    for item in tres.split(","):
        key, _, value = item.partition("=")
        if not value.isdigit():
            continue
        if key == "gres/gpu":
            untyped += int(value)
        elif key.startswith("gres/gpu:"):
            typed += int(value)
    # Slurm lists a typed count beside the untyped total; the total covers the typed.
    return untyped or typed


def parse_squeue_jobs(output, expand=lambda nodelist: (nodelist,)):
    """Jobs from squeue output in _SQUEUE_JOB_FORMAT, one per line. GPUs and nodes are the
    whole job's (tres-alloc, NodeList); expand(nodelist) turns Slurm's compressed node list
    ("gpu-[001-003]") into names, for jobs on more than one node."""
    jobs = []
    for line in output.splitlines():
        if not line.strip():
            continue
        (job_id, user, account, run_time, node_count, nodelist, tres, time_left, batch,
         requeue, name) = line.split("|", 10)
        nodelist = nodelist.strip()
        batch = _flag(batch)
        jobs.append(Job(
            id=job_id.strip(),
            user=user.strip(),
            name=name.removesuffix("|"),
            gpus=gpus_from_tres(tres.strip()),
            run_time_s=parse_run_time(run_time),
            account=account.strip(),
            nodes=tuple(expand(nodelist)) if node_count.strip() != "1" else (nodelist,),
            time_left_s=parse_run_time(time_left),  # "UNLIMITED": None
            batch=batch,
            requeueable=None if batch is None else batch and _flag(requeue) is True,
        ))
    return jobs


def _flag(text):
    """squeue's 1 / 0 as True / False; None for anything else."""
    return {"1": True, "0": False}.get(text.strip())


def run_slurm_command(argv, *, slurm_conf=None, timeout_s=DEFAULT_TIMEOUT_S, env=None):
    """Run a Slurm command-line tool (against `slurm_conf` when given); its completed
    process. ExecutorError naming the command, its exit status and the end of its stderr on
    failure, or after timeout_s. `env`: variables to add to this process's environment."""
    env = {**os.environ, **(env or {})}
    if slurm_conf:
        env["SLURM_CONF"] = str(slurm_conf)
    command = " ".join(argv)
    try:
        result = subprocess.run(list(argv), env=env, capture_output=True, text=True,
                                timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise ExecutorError(f"{command}: no answer within {timeout_s:g} s") from exc
    except OSError as exc:
        raise ExecutorError(f"{command}: cannot run: {exc}") from exc
    if result.returncode != 0:
        tail = (result.stderr.strip() or result.stdout.strip())[-500:]
        raise ExecutorError(f"{command} exited with status {result.returncode}: {tail}")
    return result


class SlurmScheduler:
    """A cluster run by Slurm, driven through its command-line tools on this machine."""

    name = "slurm"
    drives_nodes = True
    jobs_end_on_their_own = True  # batch jobs end; a drained node only has to wait

    def __init__(self, slurm_conf=None, timeout_s=DEFAULT_TIMEOUT_S):
        self.slurm_conf = slurm_conf
        self.timeout_s = timeout_s

    def _run(self, *argv):
        return run_slurm_command(argv, slurm_conf=self.slurm_conf, timeout_s=self.timeout_s).stdout

    def ping(self):
        """That slurmctld answers: what `scontrol ping` says."""
        return self._run("scontrol", "ping").strip()

    def node(self, node_name):
        line = self._run("scontrol", "show", "node", node_name, "-o")
        return node_from_fields(parse_node_line(line))

    def drain(self, node_name, reason):
        """Drain the node; running jobs go on, no new ones start. Already drained with
        this reason: nothing to do. Drained for another reason: the reason is replaced."""
        current = self.node(node_name)
        if current.drained and current.reason == reason:
            return f"{node_name} already drained: {reason}"
        self._run("scontrol", "update", f"nodename={node_name}", "state=drain",
                  f"reason={reason}")
        return f"drained {node_name}: {reason}"

    def resume(self, node_name):
        """Return the node to service (clears a drain or a down). A node that is neither:
        nothing to do (scontrol would refuse it as an invalid state)."""
        current = self.node(node_name)
        flags = current.state.split("+")
        if not current.drained and "DOWN" not in flags and "FAIL" not in flags:
            return f"{node_name} already in service ({current.state})"
        self._run("scontrol", "update", f"nodename={node_name}", "state=resume")
        return f"resumed {node_name} (was {current.state})"

    def running_jobs(self, node_name):
        output = self._run("squeue", "-h", "-w", node_name, "-t", "RUNNING",
                           "-O", _SQUEUE_JOB_FORMAT)
        return parse_squeue_jobs(output, expand=self.hostnames)

    def hostnames(self, nodelist):
        """Slurm's own expansion of a compressed node list: gpu-[001-003] -> 3 names."""
        return self._run("scontrol", "show", "hostnames", nodelist).split()

    def _job_states(self, job_ids):
        """{job id: state} of those of job_ids that slurmctld still knows."""
        try:
            output = self._run("squeue", "-h", "-t", "all", "-j", ",".join(job_ids),
                               "-o", "%i|%T")
        except ExecutorError as exc:
            # With none of the ids known any more squeue fails rather than print nothing.
            if "Invalid job id" in str(exc):
                return {}
            raise
        states = {}
        for line in output.splitlines():
            job_id, _, state = line.partition("|")
            if job_id.strip():
                states[job_id.strip()] = state.strip()
        return states

    def signal(self, node_name, jobs, signal, all_steps=False):
        """Send the running ones among the jobs `signal` ("USR1"): a batch job's batch shell
        (scancel --batch), where a checkpointing script traps it, or with all_steps its
        shell and every step (--full); a job without a batch shell, every step."""
        running = self._still_running(jobs)
        if not running:
            return "no job left to signal"
        lines = []
        shells = [job.id for job in running if job.batch]
        steps = [job.id for job in running if not job.batch]
        if shells:
            flag = "--full" if all_steps else "--batch"
            self._run("scancel", f"--signal={signal}", flag, *shells)
            whom = "the batch shell and every step" if all_steps else "the batch shell"
            lines.append(f"sent SIG{signal} to {whom} of {', '.join(shells)}")
        if steps:
            self._run("scancel", f"--signal={signal}", *steps)
            lines.append(f"sent SIG{signal} to every step of {', '.join(steps)} (no batch shell)")
        return "\n".join(lines)

    def stop(self, node_name, jobs):
        """End the running ones among the jobs now: requeue those Slurm can requeue (batch
        jobs that allow it), cancel the rest. A multi-node job is requeued or cancelled
        whole: Slurm knows no part of a job."""
        running = self._still_running(jobs)
        lines = []
        requeueable = [job.id for job in running if job.requeueable]
        if requeueable:
            lines.append(self.requeue(requeueable))
        others = [job for job in running if not job.requeueable]
        if others:
            self._run("scancel", *(job.id for job in others))
            lines.append("cancelled " + ", ".join(
                f"{job.id} ({'submitted with --no-requeue' if job.batch else 'not a batch job'}"
                f": Slurm cannot requeue it)" for job in others))
        return "\n".join(lines) or "no job left to stop"

    def _still_running(self, jobs):
        states = self._job_states([job.id for job in jobs]) if jobs else {}
        return [job for job in jobs if states.get(job.id) in _ON_ITS_NODES]

    def requeue(self, job_ids):
        """Put the running jobs among job_ids back to pending, and let them start again at
        once rather than after Slurm's requeue delay (about 121 s).

        Jobs that already left RUNNING (requeued before, finished, gone) are not requeued
        again: a finished batch job would otherwise run a second time. A job that was
        requeued and already runs again elsewhere is RUNNING, so pass the ids that
        running_jobs(node) lists now, not a list kept from before. Only batch jobs can be
        requeued; an interactive one (srun) fails with Slurm's message.
        """
        job_ids = [str(job_id) for job_id in job_ids]
        if not job_ids:
            return "no jobs to requeue"
        states = self._job_states(job_ids)
        running = [job_id for job_id in job_ids if states.get(job_id) in _ON_ITS_NODES]
        if running:
            self._run("scontrol", "requeue", ",".join(running))
        # A requeued job is COMPLETING until its processes are gone; Slurm sets its start
        # delay when that ends, so StartTime=now only sticks after it.
        deadline = time.monotonic() + self.timeout_s
        while True:
            states = self._job_states(job_ids)
            completing = [j for j in job_ids if states.get(j) == "COMPLETING"]
            if not completing or time.monotonic() > deadline:
                break
            time.sleep(REQUEUE_POLL_S)
        pending = [job_id for job_id in job_ids if states.get(job_id) == "PENDING"]
        if pending:
            self._run("scontrol", "update", f"jobid={','.join(pending)}", "StartTime=now")
        output = (f"requeued {','.join(running) or 'none'}; "
                  f"pending to start now: {','.join(pending) or 'none'}")
        if completing:
            # Requeued all the same; they start after Slurm's delay unless asked again.
            output += (f"; still completing after {self.timeout_s:g} s: "
                       f"{','.join(completing)} (requeue them again to start them now)")
        return output
