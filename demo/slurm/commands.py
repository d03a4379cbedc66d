"""sacct, squeue, scontrol and scancel for the demo's simulated fleet: what the console's
Slurm adapter (schedulers/slurm.py) and job accounting (jobs/sacct.py) run, answered in
Slurm's own formats from the fleet's jobs (agent/sim/workload.py), with drains, resumes,
requeues, signals and cancels written to the workload's state file.

Only the demo's own processes find these (demo/bin/ on their PATH, never the machine's),
and only the options the console uses are understood: anything else exits 1 with a message
that says so, as Slurm refuses what it does not know.

    DEMO_SLURM_STATE=var/fleet/slurm.json python -m demo.slurm squeue -h -w gpu-001 -t RUNNING
"""

import argparse
import os
import re
import sys
import time
from datetime import datetime

from agent.sim.workload import Workload, update_state
from common.hostlist import compress_hostlist, expand_hostlist

STATE_ENVIRONMENT = "DEMO_SLURM_STATE"
DEFAULT_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"
MIN_JOB_AGE_S = 300  # slurmctld forgets an ended job after this (squeue stops listing it)
SLURM_VERSION = "24.05.5"
CPUS_PER_NODE = 192
MEMORY_MB = 2_063_000
SIGNALS = {"USR1", "SIGUSR1", "USR2", "SIGUSR2", "TERM", "SIGTERM", "INT", "SIGINT", "KILL",
           "SIGKILL", "HUP", "SIGHUP", "CONT", "SIGCONT", "STOP", "SIGSTOP"}
CHECKPOINT_S = 20  # a job that traps SIGUSR1 checkpoints for this long, then requeues itself


class SlurmError(Exception):
    """What Slurm would print on stderr before exiting 1."""


def state_path():
    path = os.environ.get(STATE_ENVIRONMENT)
    if not path:
        raise SlurmError(f"{STATE_ENVIRONMENT} is not set: these are the demo's Slurm "
                         f"commands, for its simulated fleet only")
    return path


def workload():
    return Workload.from_file(state_path())


def slurm_time(t):
    """A time as Slurm prints it: SLURM_TIME_FORMAT in the local zone (TZ), or Unknown."""
    if t is None:
        return "Unknown"
    return datetime.fromtimestamp(t).strftime(
        os.environ.get("SLURM_TIME_FORMAT") or DEFAULT_TIME_FORMAT)


def read_time(text):
    try:
        return datetime.strptime(text, DEFAULT_TIME_FORMAT).timestamp()
    except ValueError:
        raise SlurmError(f"Invalid time specification: {text}") from None


def clock(seconds):
    """Slurm's durations: "5:02", "1:05:02", "2-01:05:02"."""
    seconds = max(0, int(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{seconds:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{seconds:02d}"
    return f"{minutes}:{seconds:02d}"


def elapsed_text(job, now):
    """sacct's Elapsed: always hours, with days when there are any."""
    seconds = 0 if job.start is None else int((job.end or now) - job.start)
    days, rest = divmod(seconds, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def tres(job):
    if job.start is None:
        return ""
    nodes = len(job.nodes)
    return (f"billing={CPUS_PER_NODE * nodes},cpu={CPUS_PER_NODE * nodes},gres/gpu={job.gpus},"
            f"mem={MEMORY_MB * nodes // 1000}G,node={nodes}")


# --- sacct ------------------------------------------------------------------------------------

SACCT_FIELDS = {
    "jobid": lambda job, now: job.id,
    "jobname": lambda job, now: job.name,
    "user": lambda job, now: job.user,
    "account": lambda job, now: job.account,
    "partition": lambda job, now: job.partition,
    "nodelist": lambda job, now: (compress_hostlist(job.nodes) if job.start is not None
                                  else "None assigned"),
    "alloctres": lambda job, now: tres(job),
    "submit": lambda job, now: slurm_time(job.submit),
    "start": lambda job, now: slurm_time(job.start),
    "end": lambda job, now: slurm_time(job.end),
    "state": lambda job, now: job.state,
    "exitcode": lambda job, now: job.exit_code,
    "elapsed": lambda job, now: elapsed_text(job, now),
    "nnodes": lambda job, now: str(len(job.nodes)),
}


def sacct(argv):
    parser = _parser("sacct")
    for flag in ("-a", "-X", "-P", "-n"):
        parser.add_argument(flag, action="store_true")
    parser.add_argument("--format", "-o", default="JobID,JobName,Partition,Account,State")
    parser.add_argument("-S", "--starttime")
    parser.add_argument("-E", "--endtime")
    args = parser.parse_args(argv)
    if not (args.X and args.P):
        raise SlurmError("the demo's sacct answers -X -P only (allocations, parsable)")
    fields = [name.strip().lower() for name in args.format.split(",")]
    unknown = [name for name in fields if name not in SACCT_FIELDS]
    if unknown:
        raise SlurmError(f"Invalid field requested: \"{unknown[0]}\"")
    now = time.time()
    since = read_time(args.starttime) if args.starttime else now - 86400
    until = read_time(args.endtime) if args.endtime else now
    lines = []
    if not args.n:
        lines.append("|".join(name for name in args.format.split(",")))
    for job in workload().jobs_between(since, min(until, now), now):
        lines.append("|".join(SACCT_FIELDS[name](job, now) for name in fields))
    return "\n".join(lines) + ("\n" if lines else "")


# --- squeue -----------------------------------------------------------------------------------

def _time_left(job, now):
    if job.start is None:
        return clock(job.time_limit_s)
    return clock(job.time_limit_s - (now - job.start))


SQUEUE_FIELDS = {  # -O names and -o letters
    "jobid": lambda job, now: job.id,
    "username": lambda job, now: job.user,
    "account": lambda job, now: job.account,
    "timeused": lambda job, now: clock(0 if job.start is None else (job.end or now) - job.start),
    "numnodes": lambda job, now: str(len(job.nodes)),
    "nodelist": lambda job, now: compress_hostlist(job.nodes) if job.start is not None else "",
    "tres-alloc": lambda job, now: tres(job),
    "timeleft": _time_left,
    "batchflag": lambda job, now: "1" if job.batch else "0",
    "requeue": lambda job, now: "1" if job.requeueable else "0",
    "name": lambda job, now: job.name,
    "state": lambda job, now: job.state,
    "partition": lambda job, now: job.partition,
}
SQUEUE_LETTERS = {"i": "jobid", "u": "username", "a": "account", "M": "timeused",
                  "D": "numnodes", "N": "nodelist", "j": "name", "T": "state",
                  "P": "partition", "L": "timeleft"}
SQUEUE_DEFAULT_STATES = {"PENDING", "RUNNING", "COMPLETING"}


def squeue(argv):
    parser = _parser("squeue")
    parser.add_argument("-h", "--noheader", action="store_true")
    parser.add_argument("-w", "--nodelist")
    parser.add_argument("-t", "--states")
    parser.add_argument("-j", "--jobs")
    parser.add_argument("-O", "--Format")
    parser.add_argument("-o", "--format")
    args = parser.parse_args(argv)
    now = time.time()
    # What slurmctld still knows: pending, running, or ended within MinJobAge.
    known = workload().jobs_between(now - MIN_JOB_AGE_S, now, now)
    if args.jobs:
        wanted = set(args.jobs.split(","))
        known = [job for job in known if job.id in wanted]
        if not known:
            raise SlurmError("slurm_load_jobs error: Invalid job id specified")
    if args.states and args.states.lower() != "all":
        states = {state.strip().upper() for state in args.states.split(",")}
        known = [job for job in known if job.state in states]
    elif not args.states:
        known = [job for job in known if job.state in SQUEUE_DEFAULT_STATES]
    if args.nodelist:
        nodes = set(expand_hostlist(args.nodelist))
        known = [job for job in known if job.start is not None and nodes & set(job.nodes)]
    columns = _squeue_columns(args)
    lines = [] if args.noheader else [
        "".join(f"{name.upper()}{suffix}" for name, suffix in columns)]
    for job in known:
        lines.append("".join(SQUEUE_FIELDS[name](job, now) + suffix for name, suffix in columns))
    return "\n".join(lines) + ("\n" if lines else "")


def _squeue_columns(args):
    """[(field, text after it)] from -O ("JobID:|,Name:|") or -o ("%i|%T")."""
    if args.Format:
        columns = []
        for item in args.Format.split(","):
            name, _, suffix = item.partition(":")
            if name.lower() not in SQUEUE_FIELDS:
                raise SlurmError(f"Invalid job format specification: {name}")
            columns.append((name.lower(), suffix))
        return columns
    columns = []
    for token in re.split(r"(%[A-Za-z])", args.format or "%i|%P|%j|%u|%T|%M|%D|%N"):
        if token.startswith("%"):
            if token[1] not in SQUEUE_LETTERS:
                raise SlurmError(f"Invalid job format specification: {token}")
            columns.append((SQUEUE_LETTERS[token[1]], ""))
        elif token and columns:
            columns[-1] = (columns[-1][0], token)
    return columns


# --- scontrol ---------------------------------------------------------------------------------

def scontrol(argv):
    if argv[:2] == ["show", "node"] and len(argv) >= 3:
        return show_node(argv[2])
    if argv[:2] == ["show", "hostnames"] and len(argv) == 3:
        return "\n".join(expand_hostlist(argv[2])) + "\n"
    if argv[:2] == ["show", "hostlist"] and len(argv) == 3:
        return compress_hostlist(argv[2].split(",")) + "\n"
    if argv[:1] == ["requeue"] and len(argv) == 2:
        return requeue(argv[1].split(","))
    if argv[:1] == ["update"]:
        settings = dict(_key_value(item) for item in argv[1:])
        if "nodename" in settings:
            return update_node(settings)
        if "jobid" in settings:
            return update_job(settings)
    raise SlurmError(f"the demo's scontrol does not know: {' '.join(argv)}")


def _key_value(item):
    key, found, value = item.partition("=")
    if not found:
        raise SlurmError(f"Invalid input: {item}")
    return key.lower(), value


def show_node(name):
    now = time.time()
    work = workload()
    if name not in work.nodes:
        raise SlurmError(f"Node {name} not found")
    state, _ = work.node_state(name, now)
    drain = work.drained(name, now)
    busy = state.startswith("ALLOCATED")
    cpus = CPUS_PER_NODE if busy else 0
    boot = slurm_time(now - 86400 * 12)
    line = (f"NodeName={name} Arch=x86_64 CoresPerSocket=48 CPUAlloc={cpus} "
            f"CPUEfctv={CPUS_PER_NODE} CPUTot={CPUS_PER_NODE} CPULoad={cpus / 4:.2f} "
            f"AvailableFeatures=h200 ActiveFeatures=h200 Gres=gpu:h200:8 NodeAddr={name} "
            f"NodeHostName={name} Version={SLURM_VERSION} OS=Linux 6.8.0-51-generic "
            f"#52-Ubuntu SMP RealMemory={MEMORY_MB} AllocMem={MEMORY_MB if busy else 0} "
            f"FreeMem={MEMORY_MB // 2} Sockets=2 Boards=1 State={state} ThreadsPerCore=1 "
            f"TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu,batch "
            f"BootTime={boot} SlurmdStartTime={boot} LastBusyTime={slurm_time(now)} "
            f"CfgTRES=cpu={CPUS_PER_NODE},mem={MEMORY_MB}M,billing={CPUS_PER_NODE},gres/gpu=8 "
            f"AllocTRES={'cpu=192,gres/gpu=8' if busy else ''} CurrentWatts=0 AveWatts=0")
    if drain is not None:
        line += f" Reason={drain['reason']} [root@{slurm_time(drain['from'])}]"
    return line + "\n"


def update_node(settings):
    name, state = settings["nodename"], settings.get("state", "").lower()
    now = time.time()

    def change(saved):
        if name not in saved["nodes"]:
            raise SlurmError(f"Invalid node name specified: {name}")
        drains = saved["drains"].setdefault(name, [])
        open_drain = next((d for d in drains if d["until"] is None), None)
        if state == "drain":
            reason = settings.get("reason")
            if not reason:
                raise SlurmError("You must specify a reason when DOWNING or DRAINING a node. "
                                 "Request denied")
            if open_drain is not None:
                open_drain["reason"] = reason
            else:
                drains.append({"from": now, "until": None, "reason": reason})
        elif state == "resume":
            if open_drain is None:
                raise SlurmError(f"Invalid node state specified: {name} is not drained")
            open_drain["until"] = now
        else:
            raise SlurmError(f"the demo's scontrol sets a node to drain or resume, not "
                             f"{state or 'nothing'}")

    update_state(state_path(), change)
    return ""


def requeue(job_ids):
    now = time.time()
    work = workload()
    for job_id in job_ids:
        job = work.job(job_id, now)
        if job is None:
            raise SlurmError(f"Invalid job id specified for job {job_id}")
        if not job.requeueable:
            raise SlurmError(f"Requested operation is presently disabled for job {job_id}")
        if job.state not in ("RUNNING", "PENDING"):
            raise SlurmError(f"Job is no longer pending execution for job {job_id}")

    def change(saved):
        for job_id in job_ids:
            saved["jobs"][job_id] = {"requeued_at": now}

    update_state(state_path(), change)
    return ""


def update_job(settings):
    if settings.get("starttime", "").lower() != "now" or set(settings) != {"jobid",
                                                                            "starttime"}:
        raise SlurmError("the demo's scontrol updates a job's StartTime=now only")
    job_ids = settings["jobid"].split(",")

    def change(saved):
        for job_id in job_ids:
            if "requeued_at" in saved["jobs"].get(job_id, {}):
                saved["jobs"][job_id]["start_now"] = True

    update_state(state_path(), change)
    return ""


# --- scancel ----------------------------------------------------------------------------------

def scancel(argv):
    parser = _parser("scancel")
    parser.add_argument("--signal", "-s")
    parser.add_argument("--batch", "-b", action="store_true")
    parser.add_argument("--full", "-f", action="store_true")
    parser.add_argument("job_ids", nargs="+")
    args = parser.parse_args(argv)
    job_ids = [job_id for item in args.job_ids for job_id in item.split(",")]
    now = time.time()
    work = workload()
    jobs = {job_id: work.job(job_id, now) for job_id in job_ids}
    for job_id, job in jobs.items():
        if job is None:
            raise SlurmError(f"Kill job error on job id {job_id}: Invalid job id specified")
    if args.signal and args.signal.upper() not in SIGNALS:
        raise SlurmError(f"Unknown job signal: {args.signal}")

    def change(saved):
        for job_id, job in jobs.items():
            if job.state not in ("RUNNING", "PENDING"):
                continue
            if not args.signal:
                saved["jobs"].setdefault(job_id, {})["cancelled_at"] = now
            elif args.signal.upper().removeprefix("SIG") == "USR1" and job.state == "RUNNING":
                # The demo's jobs checkpoint on SIGUSR1, then requeue themselves (or, when
                # they may not be requeued, end).
                if job.requeueable:
                    saved["jobs"][job_id] = {"requeued_at": now + CHECKPOINT_S}
                else:
                    saved["jobs"].setdefault(job_id, {})["cancelled_at"] = now + CHECKPOINT_S

    update_state(state_path(), change)
    return ""


# --- the command line -------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise SlurmError(f"{self.prog}: {message}")


def _parser(prog):
    return _Parser(prog=prog, add_help=False)


COMMANDS = {"sacct": sacct, "squeue": squeue, "scontrol": scontrol, "scancel": scancel}


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m demo.slurm {{{','.join(COMMANDS)}}} ...", file=sys.stderr)
        return 2
    try:
        sys.stdout.write(COMMANDS[argv[0]](argv[1:]))
    except SlurmError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    return 0
