from django.db import models


class Action(models.TextChoices):
    """DESIGN.md's repair actions, cheapest first."""

    CLEANUP = "cleanup", "clean up"
    RECONFIGURE = "reconfigure", "reconfigure"
    RESET_GPU = "reset_gpu", "reset GPU"
    REBOOT = "reboot", "reboot"
    REPROVISION = "reprovision", "reprovision"
    FAILOVER = "failover", "failover"
    REMOVE = "remove", "remove"


ACTIONS_BY_COST = [Action.CLEANUP, Action.RECONFIGURE, Action.RESET_GPU, Action.REBOOT,
                   Action.REPROVISION, Action.FAILOVER, Action.REMOVE]

ACTION_EXPLANATIONS = {
    Action.CLEANUP: "the agent ends what ended jobs left running and reaps zombies; the node "
                    "stays in service and running jobs go on",
    Action.RECONFIGURE: "Slurm's GPU view rebuilt from the hardware (the node's gres.conf and "
                        "the controller's); the node stays in service and running jobs go on",
    Action.RESET_GPU: "the agent resets this one GPU once no process holds it (nvidia-smi "
                      "--gpu-reset); the node is drained first, since its scheduler cannot "
                      "take one GPU out of service; no reboot, local data is kept",
    Action.REBOOT: "reboot in place; local data is kept",
    Action.REPROVISION: "a clean OS image; local data is cleared",
    Action.FAILOVER: "the workload moves to a fresh node; local data is cleared",
    Action.REMOVE: "out of the pool, to RMA",
}


def cost(action):
    return ACTIONS_BY_COST.index(action)


# The actions the node's agent carries out (a command); the others are the provider's.
AGENT_ACTIONS = (Action.CLEANUP, Action.RECONFIGURE, Action.RESET_GPU, Action.REBOOT)
# The actions that act on the repair's GPU: a rung a node-level signal skips.
GPU_ACTIONS = (Action.RESET_GPU,)
# The actions that leave the node in service: no drain, no pause, no blast-radius count and
# no cooldown after them, so the next rung of a ladder can follow at once.
IN_SERVICE_ACTIONS = (Action.CLEANUP, Action.RECONFIGURE)
# The actions only some signatures call for.
ACTION_SIGNATURES = {
    Action.CLEANUP: ("zombie_processes", "pid_pressure", "job_leftovers"),
    Action.RECONFIGURE: ("gres_drift",),
}


class DrainMode(models.TextChoices):
    """How a repair that takes the node out treats the jobs on it (DESIGN.md "Drain modes")."""

    NO_DRAIN = "no_drain", "no drain"
    NOW = "now", "now"
    AFTER_JOBS = "after_jobs", "after the jobs end"
    SIGNAL = "signal", "signal, then wait"


DRAIN_MODE_EXPLANATIONS = {
    DrainMode.NO_DRAIN: "the node stays in service and its jobs run on",
    DrainMode.NOW: "requeue the jobs that Slurm can requeue and cancel the rest (a multi-node "
                   "job whole); pods are evicted, and deleted with their grace period where a "
                   "disruption budget refuses",
    DrainMode.AFTER_JOBS: "drain, and act once no job runs on the node, up to a deadline",
    DrainMode.SIGNAL: "drain and send the jobs a signal that checkpointing jobs handle, wait "
                      "up to a grace period for them to end or requeue, then go on as now",
}

# The deadline of the modes that wait, unless the policy sets one.
DEFAULT_DRAIN_DEADLINE_S = {DrainMode.AFTER_JOBS: 24 * 3600, DrainMode.SIGNAL: 600}
DEFAULT_DRAIN_SIGNAL = "USR1"


class AtDeadline(models.TextChoices):
    """What an "after the jobs end" drain does when its deadline passes."""

    GO_ON = "go_on", "go on as now"
    KEEP_WAITING = "keep_waiting", "keep waiting, with an alert"


class Status(models.TextChoices):
    """DESIGN.md's repair statuses; repairs/transitions.py holds the moves between them."""

    PROPOSED = "proposed", "proposed"
    APPROVED = "approved", "approved"
    WAITING = "waiting", "waiting"
    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    REJECTED = "rejected", "rejected"
    RESOLVED = "resolved", "resolved"
    SUPERSEDED = "superseded", "superseded"
    CANCELLED = "cancelled", "cancelled"
    ABORTED = "aborted", "aborted"  # stopped while running, by an operator


# A node has at most one repair in these at a time.
OPEN_STATUSES = (Status.PROPOSED, Status.APPROVED, Status.WAITING, Status.RUNNING)
FINISHED_STATUSES = tuple(s for s in Status if s not in OPEN_STATUSES)

STATUS_COLOURS = {
    Status.PROPOSED: "booting",
    Status.APPROVED: "booting",
    Status.WAITING: "paused",
    Status.RUNNING: "booting",
    Status.SUCCEEDED: "healthy",
    Status.FAILED: "unhealthy",
    Status.REJECTED: "pending",
    Status.RESOLVED: "healthy",
    Status.SUPERSEDED: "pending",
    Status.CANCELLED: "pending",
    Status.ABORTED: "paused",
}


class StepKind(models.TextChoices):
    DRAIN = "drain", "drain"
    COLLECT_BUNDLE = "collect_bundle", "collect the diagnostic bundle"
    ACT = "act", "act"
    WAIT_FOR_NODE = "wait_for_node", "wait for the node"
    VERIFY = "verify", "verify"
    RESUME = "resume", "resume"


# The steps of each action, in order.
STEPS = {
    # The agent ends the leftovers; verify sees the signal that called for it close.
    Action.CLEANUP: [StepKind.ACT, StepKind.VERIFY],
    # slurmd restarts in place: nothing to drain, no boot to wait for; verify sees Slurm's
    # view match the hardware again.
    Action.RECONFIGURE: [StepKind.ACT, StepKind.VERIFY],
    # The agent answers ok once the GPU answers NVML again: no boot to wait for. Every action
    # that touches the node keeps the evidence first, right before the act.
    Action.RESET_GPU: [StepKind.DRAIN, StepKind.COLLECT_BUNDLE, StepKind.ACT, StepKind.VERIFY,
                       StepKind.RESUME],
    Action.REBOOT: [StepKind.DRAIN, StepKind.COLLECT_BUNDLE, StepKind.ACT,
                    StepKind.WAIT_FOR_NODE, StepKind.VERIFY, StepKind.RESUME],
    Action.REPROVISION: [StepKind.DRAIN, StepKind.COLLECT_BUNDLE, StepKind.ACT,
                         StepKind.WAIT_FOR_NODE, StepKind.VERIFY, StepKind.RESUME],
    Action.FAILOVER: [StepKind.DRAIN, StepKind.COLLECT_BUNDLE, StepKind.ACT,
                      StepKind.WAIT_FOR_NODE, StepKind.VERIFY, StepKind.RESUME],
    Action.REMOVE: [StepKind.DRAIN, StepKind.COLLECT_BUNDLE, StepKind.ACT],
}


class StepStatus(models.TextChoices):
    PENDING = "pending", "pending"
    RUNNING = "running", "running"
    WAITING = "waiting", "waiting"  # re-checked on a schedule (jobs to finish, the node to boot)
    DONE = "done", "done"
    FAILED = "failed", "failed"
