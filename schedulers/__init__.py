"""The cluster's scheduler (Cluster.scheduler): Slurm, Kubernetes or none. Repairs drain and
resume nodes through it and ask which jobs a repair would hit; job accounting reads Slurm's.
Each is a small class behind one interface; scheduler_for(cluster) picks it.

    scheduler.ping() -> what it answered (ExecutorError when it does not)
    scheduler.drain(node_name, reason) -> output      scheduler.resume(node_name) -> output
    scheduler.node(node_name) -> SchedulerNode         scheduler.running_jobs(node_name) -> [Job]
    scheduler.signal(node_name, jobs, signal, all_steps) -> output   (ask the jobs to end)
    scheduler.stop(node_name, jobs) -> output                         (end them now)
    scheduler.jobs_end_on_their_own   (False: waiting means asking them, as Kubernetes does)

A repair's drain mode (repairs.drain_modes) picks which of signal and stop its drain step
calls, and when.

Every method is idempotent: a step that a killed worker left half done runs again, and
asking for what is already so (draining a drained node) succeeds without doing it twice.
A failure raises ExecutorError with a message an operator can act on (the command, its
exit status and the end of its output); the machine providers of repairs.providers raise it
too.
"""

from clusters.models import Cluster

from .base import ExecutorError, Job, NoScheduler, RetryLater, SchedulerNode
from .slurm import SlurmScheduler

__all__ = ["ExecutorError", "Job", "NoScheduler", "RetryLater", "SchedulerNode",
           "scheduler_for"]


def scheduler_for(cluster):
    """The scheduler the cluster is configured with (Cluster.scheduler, .scheduler_config)."""
    if cluster.scheduler == Cluster.Scheduler.SLURM:
        return SlurmScheduler(slurm_conf=cluster.scheduler_config or None)
    if cluster.scheduler == Cluster.Scheduler.KUBERNETES:
        # Imported when needed, not for a cycle: the Kubernetes client takes a second to
        # import, and most clusters never use it.
        from .kubernetes import from_kubeconfig

        return from_kubeconfig(cluster.scheduler_config or None)
    return NoScheduler()
