"""How a repair touches the world outside the console: the cluster's scheduler (drain,
resume, the jobs on a node) and the provider that reprovisions, fails over or removes a
machine. Each is a small class behind one interface; repairs.steps picks them per cluster.

    scheduler.drain(node_name, reason) -> output      scheduler.resume(node_name) -> output
    scheduler.node(node_name) -> SchedulerNode         scheduler.running_jobs(node_name) -> [Job]
    scheduler.requeue(job_ids) -> output
    provider.run(action, node_name) -> output          action: reprovision, failover, remove

A provider's run() starts the action and returns (a command with a time limit, or an API
call); the repair then waits for the node to come back (a hello with a new boot id).

Every method is idempotent: a step that a killed worker left half done runs again, and
asking for what is already so (draining a drained node) succeeds without doing it twice.
A failure raises ExecutorError with a message an operator can act on (the command, its
exit status and the end of its output).
"""

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
