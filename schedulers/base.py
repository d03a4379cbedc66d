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
    """A job (Slurm) or workload pod (Kubernetes) running on a node: what a repair hits."""

    id: str
    user: str
    name: str = ""
    gpus: int | None = None
    run_time_s: int | None = None


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

    def drain(self, node_name, reason):
        return "no scheduler configured: nothing to drain"

    def resume(self, node_name):
        return "no scheduler configured: nothing to resume"

    def node(self, node_name):
        return SchedulerNode(state="unknown", drained=True)

    def running_jobs(self, node_name):
        return []

    def requeue(self, job_ids):
        return "no scheduler configured: nothing to requeue"
