"""Which repair a failure calls for: the cluster's policy rows, else the defaults below,
then escalation by the node's history (DESIGN.md "Repairs").

Defaults:
    xid:<code>              NVIDIA's catalog, through healthchecks.xid_catalog.policy_for
                            (reboot, reprovision, remove for the GPU's model, or none)
    gpu_lost, slurm_drain   reboot (DESIGN.md)
    thermal_throttle, hw_slowdown, power_brake
                            failover, once the event has persisted (THROTTLE_PERSISTS)
    ecc_dbe, row_remap_pending, gpu_recovery_action, slow_gpu, check:<name>
                            reboot: a GPU reset (here, a reboot) is what clears them
    row_remap_failure       remove: the memory can no longer be repaired in place
    slurmd_down, slurmd_flapping, job_leftovers
                            reboot: slurmd keeps dying, or a process holds GPU memory that
                            ending it did not free (the next job would start on a dirty GPU)
    gres_drift              reconfigure (then reboot, by escalation)
    zombie_processes, pid_pressure
                            none: the node page's clean-up is the operator's tool
    anything else           none (heartbeat_lost among them: an agent that does not answer
                            cannot reboot its node; an operator decides)
"""

from dataclasses import dataclass
from datetime import timedelta

from healthchecks.xid_catalog import policy_for, xid_code

from .choices import Action, cost, one_step_costlier
from .models import Repair

THROTTLE_SIGNATURES = ("thermal_throttle", "hw_slowdown", "power_brake")
THROTTLE_PERSISTS = timedelta(minutes=15)
ESCALATION_WINDOW = timedelta(days=7)
COOLDOWN = timedelta(minutes=30)

DEFAULT_ACTIONS = {
    "gpu_lost": Action.REBOOT,
    "slurm_drain": Action.REBOOT,
    "ecc_dbe": Action.REBOOT,
    "row_remap_pending": Action.REBOOT,
    "gpu_recovery_action": Action.REBOOT,
    "slow_gpu": Action.REBOOT,
    "row_remap_failure": Action.REMOVE,
    "slurmd_down": Action.REBOOT,
    "slurmd_flapping": Action.REBOOT,
    "job_leftovers": Action.REBOOT,
    "gres_drift": Action.RECONFIGURE,
    **{signature: Action.FAILOVER for signature in THROTTLE_SIGNATURES},
}


@dataclass(frozen=True)
class Choice:
    action: str
    why: str


def default_action(event):
    """(action or None, why) by the defaults above."""
    kind, _, code = event.signature.partition(":")
    if xid_code(event.signature) is not None:
        model = event.gpu.name if event.gpu is not None else ""
        xid = policy_for(int(code), model)
        return xid.recommendation, f"NVIDIA's catalog for Xid {code}: {xid.explanation}"
    if kind == "check":
        return Action.REBOOT, f"the {code} check failed"
    action = DEFAULT_ACTIONS.get(event.signature)
    return action, f"the default for {event.signature}" if action else "no default repair"


def choose_action(event, policies, now):
    """The Choice for one open event, or None. policies: {signature: RepairPolicy} of the
    node's cluster."""
    row = policies.get(event.signature)
    if row is not None:
        if not row.action:
            return None
        action, why = row.action, f"the cluster's policy for {event.signature}"
    else:
        action, why = default_action(event)
        if action is None:
            return None
    if event.signature in THROTTLE_SIGNATURES and now - event.first_seen < THROTTLE_PERSISTS:
        return None  # throttling calls for a repair only once it persists
    return Choice(action, why)


def escalate(node, signature, choice, now):
    """One step costlier than the last repair of the same signature on this node, when that
    repair ran within the last 7 days."""
    last = (Repair.objects.filter(node=node, signature=signature, finished_at__isnull=False,
                                  started_at__isnull=False,
                                  finished_at__gte=now - ESCALATION_WINDOW)
            .order_by("-finished_at").first())
    if last is None:
        return choice
    stronger = one_step_costlier(last.action)
    if cost(stronger) <= cost(choice.action):
        return choice
    return Choice(stronger, f"{choice.why}; escalated: {signature} again within 7 days of "
                            f"repair #{last.pk} ({last.action})")


def in_cooldown(node, now):
    """A repair of this node ended less than 30 minutes ago."""
    return Repair.objects.filter(node=node, started_at__isnull=False,
                                 finished_at__gte=now - COOLDOWN).exists()
