"""What every scheduler answers with, and the one for a cluster without a scheduler
(schedulers/__init__.py has the interface)."""

from dataclasses import dataclass


class ExecutorError(Exception):
    """A scheduler or provider call failed; str() says what and why."""


class RetryLater(ExecutorError):
    """Not possible yet, but not a failure (a disruption budget allows no eviction now): the
    step tries again on its schedule."""


@dataclass(frozen=True)
class Job:
    """A job (Slurm) or workload pod (Kubernetes) running on a node: what a repair hits.
    gpus and nodes are the whole job's: a multi-node job loses all its nodes' progress."""

    id: str
    user: str
    name: str = ""  # Slurm: the job's name; Kubernetes: its owner ("Job/train-llama")
    gpus: int | None = None
    run_time_s: int | None = None
    account: str = ""  # Slurm: the account; Kubernetes: the namespace
    nodes: tuple = ()  # every node it runs on
    time_left_s: int | None = None  # until its time limit; None: no limit, or unknown
    batch: bool | None = None  # Slurm: a batch job (it has a batch shell to signal)
    requeueable: bool | None = None  # Slurm: a batch job that allows requeueing

    @property
    def gpu_hours(self):
        """GPU-hours it has used so far, or None when its GPUs or run time are unknown."""
        if self.gpus is None or self.run_time_s is None:
            return None
        return self.gpus * self.run_time_s / 3600


@dataclass(frozen=True)
class SchedulerNode:
    """The scheduler's view of a node: `drained` once it takes no new work; `reason` the
    scheduler's note (for Slurm, the drain reason)."""

    state: str
    drained: bool
    reason: str = ""


class NoScheduler:
    """A cluster without a scheduler clusterui can drive: nothing to drain or resume, no
    jobs known."""

    name = "none"
    drives_nodes = False  # the schedulers that drain and resume nodes say True
    jobs_end_on_their_own = True

    def ping(self):
        return "no scheduler: nothing to reach"

    def drain(self, node_name, reason):
        return "no scheduler configured: nothing to drain"

    def resume(self, node_name):
        return "no scheduler configured: nothing to resume"

    def node(self, node_name):
        return SchedulerNode(state="unknown", drained=True)

    def running_jobs(self, node_name):
        return []

    def signal(self, node_name, jobs, signal, all_steps=False):
        return "no scheduler configured: no jobs to signal"

    def stop(self, node_name, jobs):
        return "no scheduler configured: no jobs to stop"
