"""The simulated fleet's Slurm jobs: multi-node training runs, single-node jobs and a queue,
the same in every process that asks. The fleet's agents report each job's end (its
job_cleanup notice) and run their GPUs busy while a job holds them; the demo's Slurm
commands (demo/slurm) list the same jobs to the console.

    workload = Workload.from_file("var/fleet/slurm.json")
    workload.jobs_between(since, until, now)   # every job pending, running or ended then
    workload.running_on("gpu-012", now)        # the job that holds the node, or None
    workload.ended_on("gpu-012", since, until, now)   # its jobs that ended in (since, until]
    workload.node_state("gpu-012", now)        # ("ALLOCATED+DRAIN", "the drain's reason")

The jobs come from the time alone: each lane (a fixed group of 8, 4, 2 or 1 nodes that run
jobs together) plays a seeded sequence of jobs in each 12-hour period; the second lane of
eight (gpu-009 to gpu-016 in the demo) holds one long pretraining run. What operators did
through Slurm changes that, and the state file records it (demo/slurm writes it):

    {"nodes": ["gpu-001", ...], "seed": "demo",
     "drains": {"gpu-012": [{"from": 1764000000.0, "until": null, "reason": "..."}]},
     "jobs": {"1433672": {"requeued_at": 1764000100.0, "start_now": true},
              "1433690": {"cancelled_at": 1764000200.0}}}

- A drained node starts no job: a job of the sequence that would start on it while it is
  drained does not run (Slurm would have placed it elsewhere).
- A requeued job is pending from its requeue until its nodes are all in service again
  (and, unless asked to start now, Slurm's requeue delay has passed); then it runs again
  on the same nodes for what it had left.
- A cancelled job ends then, CANCELLED.
"""

import fcntl
import json
import os
import random
from dataclasses import dataclass, replace
from functools import lru_cache

PERIOD_S = 12 * 3600
# Job ids grow with the period: 12-hour periods since 2026-01-01 UTC.
ID_EPOCH = 1767225600
LANE_SIZES = (8, 8, 8, 4, 4, 4, 2, 2)  # then single nodes
REQUEUE_DELAY_S = 120  # Slurm's: a requeued job waits this long before it may start again
START_NOW_S = 5
GIVE_UP_S = 3600  # a job waiting for drained nodes is cancelled by its user after this

# (name, user, account, hours low-high, memory fraction of each GPU low-high)
MULTI_NODE_JOBS = (
    ("llama3-70b-pretrain", "alice", "llm-pretrain", (3.0, 10.0), (0.82, 0.95)),
    ("mixtral-8x7b-sft", "bob", "llm-pretrain", (2.0, 6.0), (0.70, 0.90)),
    ("vit-h14-pretrain", "chen", "vision", (2.0, 8.0), (0.55, 0.80)),
    ("rlhf-ppo-13b", "erik", "research", (1.5, 5.0), (0.60, 0.85)),
    ("nccl-allreduce-bench", "fatima", "infra", (0.1, 0.3), (0.10, 0.25)),
)
SINGLE_NODE_JOBS = (
    ("eval-harness", "dana", "research", (0.3, 2.0), (0.40, 0.70)),
    ("sweep-lr", "erik", "research", (0.5, 3.0), (0.30, 0.60)),
    ("clip-finetune", "chen", "vision", (1.0, 4.0), (0.50, 0.75)),
    ("tokenize-shards", "bob", "llm-pretrain", (0.2, 1.0), (0.05, 0.15)),
    ("dcgm-diag", "fatima", "infra", (0.05, 0.2), (0.20, 0.40)),
    ("jupyter", "dana", "research", (1.0, 6.0), (0.10, 0.35)),
)
# The second lane of eight holds one long pretraining run, resubmitted every 12 hours from
# its checkpoint: always busy but for a few minutes between runs.
LONG_RUN_LANES = (1,)
LONG_RUN = ("llama3-405b-pretrain", "alice", "llm-pretrain")
# (state, exit code, share): how the jobs of the sequence end.
OUTCOMES = (("COMPLETED", "0:0", 0.85), ("FAILED", "1:0", 0.07),
            ("CANCELLED", "0:15", 0.05), ("TIMEOUT", "0:0", 0.03))


@dataclass(frozen=True)
class SimJob:
    """One job as Slurm sees it at `now` (Workload's answers)."""

    id: str
    name: str
    user: str
    account: str
    partition: str
    nodes: tuple
    gpus_per_node: int
    submit: float
    start: float | None  # None while pending
    end: float | None  # None until it ends
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT
    exit_code: str
    time_limit_s: int
    memory_fraction: float  # of each GPU's memory, while it runs
    intensity: float  # how busy its GPUs are, 0-1
    batch: bool = True
    requeueable: bool = True

    @property
    def gpus(self):
        return self.gpus_per_node * len(self.nodes)


@dataclass(frozen=True)
class _Planned:
    """A job of a lane's sequence before what operators did."""

    id: str
    lane: tuple
    template: tuple
    submit: float
    start: float
    end: float
    state: str
    exit_code: str
    time_limit_s: int
    memory_fraction: float
    intensity: float
    gpus_per_node: int


def lanes_of(nodes):
    """The node names in lanes: groups of LANE_SIZES while they last, then one node each."""
    nodes = sorted(nodes)
    lanes, position = [], 0
    for size in LANE_SIZES:
        if position + size > len(nodes):
            break
        lanes.append(tuple(nodes[position:position + size]))
        position += size
    lanes += [(name,) for name in nodes[position:]]
    return lanes


@lru_cache(maxsize=4096)
def _lane_period(seed, lane_number, lane, period):
    """The jobs lane `lane_number` runs in 12-hour period `period`, before operators."""
    rng = random.Random(f"{seed}/{lane_number}/{period}")
    begin = ID_EPOCH + period * PERIOD_S + _phase(seed, lane_number)
    finish = begin + PERIOD_S
    if lane_number in LONG_RUN_LANES and len(lane) > 1:
        start = begin + rng.uniform(120, 360)
        return (_Planned(
            id=_job_id(period, lane_number, 0), lane=lane, template=LONG_RUN,
            submit=start - rng.uniform(5, 60), start=start, end=finish, state="COMPLETED",
            exit_code="0:0", time_limit_s=PERIOD_S, memory_fraction=round(
                rng.uniform(0.88, 0.95), 3), intensity=round(rng.uniform(0.9, 1.0), 3),
            gpus_per_node=8),)
    templates = MULTI_NODE_JOBS if len(lane) > 1 else SINGLE_NODE_JOBS
    # A few lanes sit idle for a while in a period: not every node is always busy.
    t = begin + rng.uniform(60, 1200) + (rng.uniform(1, 3) * 3600 if rng.random() < 0.12 else 0)
    jobs = []
    for k in range(64):
        template = rng.choice(templates)
        low, high = template[3]
        planned_s = rng.uniform(low, high) * 3600
        if t + planned_s > finish:
            break
        state, exit_code = _outcome(rng)
        run_s = planned_s * (rng.uniform(0.05, 0.9) if state in ("FAILED", "CANCELLED")
                             else 1.0)
        limit_s = int(planned_s // 3600 + 1) * 3600
        if state == "TIMEOUT":
            run_s = planned_s = limit_s
        wait_s = rng.uniform(30, 5400) if k else rng.uniform(5, 600)
        mem_low, mem_high = template[4]
        jobs.append(_Planned(
            id=_job_id(period, lane_number, k), lane=lane,
            template=template, submit=t - wait_s, start=t, end=t + run_s, state=state,
            exit_code=exit_code, time_limit_s=limit_s,
            memory_fraction=round(rng.uniform(mem_low, mem_high), 3),
            intensity=round(rng.uniform(0.6, 1.0), 3),
            # A node's job holds all its GPUs, unless it is a small single-node one.
            gpus_per_node=8 if len(lane) > 1 else rng.choice((8, 8, 4, 2, 1))))
        t += run_s + rng.uniform(20, 900)
    return tuple(jobs)


def _job_id(period, lane_number, k):
    return str(100000 + (period * 256 + lane_number) * 64 + k)


def _outcome(rng):
    roll = rng.random()
    for state, exit_code, share in OUTCOMES:
        if roll < share:
            return state, exit_code
        roll -= share
    return OUTCOMES[0][:2]


@lru_cache(maxsize=1024)
def _phase(seed, lane_number):
    """Where the lane's 12-hour periods start: each lane at its own time, so that lanes do not
    idle together."""
    return random.Random(f"{seed}/{lane_number}").uniform(0, PERIOD_S)


def _period_of(t, phase):
    return int((t - ID_EPOCH - phase) // PERIOD_S)


class Workload:
    """The jobs of a fleet of `nodes`, with what operators did (`drains`, `jobs`)."""

    def __init__(self, nodes, seed="demo", drains=None, jobs=None):
        self.seed = seed
        self.nodes = sorted(nodes)
        self.lanes = lanes_of(self.nodes)
        self._lane_of = {name: number for number, lane in enumerate(self.lanes)
                         for name in lane}
        self.drains = drains or {}
        self.overrides = jobs or {}

    @classmethod
    def from_file(cls, path):
        with open(path) as file:
            state = json.load(file)
        return cls(state["nodes"], state.get("seed", "demo"), state.get("drains"),
                   state.get("jobs"))

    # What the fleet and the shims ask

    def jobs_between(self, since, until, now):
        """Every job (as at `now`) submitted by `until` and not ended before `since`."""
        found = [job for number in range(len(self.lanes))
                 for job in self._lane_jobs_between(number, since, until, now)]
        return sorted(found, key=lambda job: int(job.id))

    def jobs_on(self, node, since, until, now):
        """The node's jobs (its lane's) that jobs_between would list."""
        number = self._lane_of.get(node)
        return [] if number is None else self._lane_jobs_between(number, since, until, now)

    def running_on(self, node, now):
        """The job running on the node at `now`, or None."""
        for job in self.jobs_on(node, now, now, now):
            if job.state == "RUNNING":
                return job
        return None

    def ended_on(self, node, since, until, now):
        """The jobs that ended on the node in (since, until]."""
        return [job for job in self.jobs_on(node, since, until, now)
                if job.end is not None and since < job.end <= until and job.start is not None]

    def job(self, job_id, now):
        """The job with this id as at `now`, or None (searching its period's lanes)."""
        number, period = _lane_and_period(job_id)
        if number is None or number >= len(self.lanes):
            return None
        planned = _lane_period(self.seed, number, self.lanes[number], period)
        for item in planned:
            if item.id == job_id:
                return self._as_at(item, now)
        return None

    def node_state(self, node, now):
        """(State, Reason) as `scontrol show node` says them: ALLOCATED while a job runs on
        the node, else IDLE, with +DRAIN and the drain's reason while it is drained."""
        state = "ALLOCATED" if self.running_on(node, now) is not None else "IDLE"
        drain = self.drained(node, now)
        return (f"{state}+DRAIN", drain["reason"]) if drain is not None else (state, None)

    def drained(self, node, at):
        """The drain holding the node at `at` ({"from", "until", "reason"}), or None."""
        for drain in self.drains.get(node, ()):
            if drain["from"] <= at and (drain["until"] is None or at < drain["until"]):
                return drain
        return None

    # The lanes' sequences, changed by what operators did

    def _lane_jobs_between(self, number, since, until, now):
        return [job for job in self._lane_jobs(number, since, until, now)
                if job.submit <= until and (job.end is None or job.end >= since)]

    def _lane_jobs(self, number, since, until, now):
        lane = self.lanes[number]
        phase = _phase(self.seed, number)
        # A job may be submitted in the period before the one it starts in, and a requeued
        # one runs on past its own.
        first = _period_of(min(since, now), phase) - 1
        last = _period_of(max(until, now), phase)
        jobs = []
        for period in range(first, last + 1):
            for item in _lane_period(self.seed, number, lane, period):
                job = self._as_at(item, now)
                if job is not None:
                    jobs.append(job)
        return jobs

    def _as_at(self, item, now):
        """The planned job as Slurm shows it at `now`; None when it never ran because a
        node of its lane was drained when it was due to start."""
        override = self.overrides.get(item.id, {})
        name, user, account = item.template[:3]
        job = SimJob(
            id=item.id, name=name, user=user, account=account,
            partition="gpu" if len(item.lane) > 1 else "batch", nodes=item.lane,
            gpus_per_node=item.gpus_per_node, submit=item.submit, start=item.start, end=item.end,
            state=item.state, exit_code=item.exit_code, time_limit_s=item.time_limit_s,
            memory_fraction=item.memory_fraction, intensity=item.intensity,
            requeueable=user != "dana")  # dana's jobs are interactive work: --no-requeue
        if override.get("requeued_at", float("inf")) <= now:
            job = self._requeued(job, item, override, now)
        else:
            job = self._held_by_drains(job, item)
        if "cancelled_at" in override:
            cancelled = override["cancelled_at"]
            if job.end is None or cancelled < job.end:
                job = replace(job, end=cancelled, state="CANCELLED", exit_code="0:15",
                              start=job.start if job.start is not None
                              and job.start <= cancelled else None)
        return _at(job, now)

    def _held_by_drains(self, job, item):
        """A job due to start while a node of its lane is drained waits for it: it starts
        when the drain ends, if that is within GIVE_UP_S; else its user cancels it then,
        still pending."""
        drains = [self.drained(node, item.start) for node in item.lane]
        ends = [drain["until"] for drain in drains if drain is not None]
        if not ends:
            return job
        if None not in ends and max(ends) < item.start + GIVE_UP_S:
            shift = max(ends) + START_NOW_S - item.start
            return replace(job, start=item.start + shift, end=item.end + shift)
        return replace(job, start=None, end=item.start + GIVE_UP_S, state="CANCELLED",
                       exit_code="0:0")

    def _requeued(self, job, item, override, now):
        """After `scontrol requeue`: pending, then running again on the same nodes for what
        it had left, once they are back in service."""
        requeued = override["requeued_at"]
        delay = START_NOW_S if override.get("start_now") else REQUEUE_DELAY_S
        restart = requeued + delay
        for node in item.lane:
            for drain in self.drains.get(node, ()):
                if drain["from"] <= restart and (drain["until"] is None
                                                 or drain["until"] > restart):
                    if drain["until"] is None:
                        return replace(job, start=None, end=None, state="PENDING",
                                       exit_code="0:0")
                    restart = drain["until"] + delay
        left = max(item.end - requeued, 300)
        return replace(job, start=restart, end=restart + left,
                       state=item.state if item.state != "TIMEOUT" else "COMPLETED",
                       exit_code=item.exit_code if item.state != "TIMEOUT" else "0:0")


def _at(job, now):
    """The job's state at `now`: pending before it starts, running until it ends."""
    if job.state == "PENDING":
        return job if job.submit <= now else None
    if job.submit > now:
        return None  # not submitted yet
    if job.start is None and job.end is not None and now >= job.end:
        return job  # cancelled while pending
    if job.start is None or now < job.start:
        return replace(job, start=None, end=None, state="PENDING", exit_code="0:0")
    if job.end is None or now < job.end:
        return replace(job, end=None, state="RUNNING", exit_code="0:0")
    return job


def _lane_and_period(job_id):
    try:
        number = int(job_id) - 100000
    except ValueError:
        return None, None
    if number < 0:
        return None, None
    period, lane_number = divmod(number // 64, 256)
    return lane_number, period


# The state file: read by everyone, written by demo/slurm under a lock

def new_state(nodes, seed="demo"):
    return {"nodes": sorted(nodes), "seed": seed, "drains": {}, "jobs": {}}


def update_state(path, change):
    """Apply change(state) to the state file under an exclusive lock, written whole (a
    reader never sees half a file); change's return value is returned."""
    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with open(path) as file:
            state = json.load(file)
        result = change(state)
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "w") as file:
            json.dump(state, file, indent=1, sort_keys=True)
        os.replace(temporary, path)
    return result


class WorkloadFile:
    """A Workload read again whenever its state file changes (the fleet's view)."""

    def __init__(self, path):
        self.path = path
        self._stamp = None
        self._workload = None

    def current(self):
        stamp = os.stat(self.path).st_mtime_ns
        if stamp != self._stamp:
            self._workload = Workload.from_file(self.path)
            self._stamp = stamp
        return self._workload
