"""How a repair treats the jobs on its node (DESIGN.md "Drain modes"). A repair carries its
DrainPlan from the moment it is proposed: the cluster's policy for its signature, else the
signature catalog's default (healthchecks/data/signatures.tsv, column `drain`); the
approver may choose another mode, and the plan is then made again for that mode.

    plan = plan_for(cluster, "xid:79", Action.REBOOT)     # DrainPlan(mode="now")
    plan = plan_for(cluster, "thermal_throttle", Action.FAILOVER)
    # DrainPlan(mode="after_jobs", deadline_s=86400, at_deadline="keep_waiting")

Clean-up and reconfigure leave the node in service: their plan is always "no drain".
"""

from dataclasses import dataclass
from datetime import timedelta

from common.durations import duration_text
from healthchecks.signatures import info_for

from .choices import (
    DEFAULT_DRAIN_DEADLINE_S,
    DEFAULT_DRAIN_SIGNAL,
    DRAIN_MODE_EXPLANATIONS,
    IN_SERVICE_ACTIONS,
    AtDeadline,
    DrainMode,
)
from .models import RepairPolicy

# A signature the catalog gives no mode (a repair proposed by hand, an unknown signal): the
# mode that never ends a job before it could.
FALLBACK_MODE = DrainMode.AFTER_JOBS
TAKING_THE_NODE_OUT = (DrainMode.NOW, DrainMode.AFTER_JOBS, DrainMode.SIGNAL)


@dataclass(frozen=True)
class DrainPlan:
    mode: str
    deadline_s: int | None = None  # after_jobs and signal: how long the drain waits
    at_deadline: str = ""  # after_jobs: AtDeadline
    signal: str = ""  # signal: its name, as scancel --signal takes it ("USR1")
    signal_all_steps: bool = False  # signal: every step and the batch shell, not the shell only

    @property
    def waits(self):
        return self.mode in (DrainMode.AFTER_JOBS, DrainMode.SIGNAL)

    @property
    def deadline(self):
        return timedelta(seconds=self.deadline_s) if self.deadline_s else None

    @property
    def words(self):
        """The plan in one line, for the card and the repair's page."""
        label = DrainMode(self.mode).label
        if self.mode == DrainMode.AFTER_JOBS:
            then = ("then go on as now" if self.at_deadline == AtDeadline.GO_ON
                    else "then keep waiting, with an alert, until an operator goes on or aborts")
            return f"{label}: wait up to {duration_text(self.deadline_s)}, {then}"
        if self.mode == DrainMode.SIGNAL:
            whom = "every step of each job" if self.signal_all_steps else "each job's batch shell"
            return (f"{label}: SIG{self.signal} to {whom}, wait up to "
                    f"{duration_text(self.deadline_s)}, then go on as now")
        return f"{label}: {DRAIN_MODE_EXPLANATIONS[self.mode]}"

    def as_fields(self):
        """The plan as Repair fields."""
        return {"drain_mode": self.mode, "drain_deadline_s": self.deadline_s,
                "drain_at_deadline": self.at_deadline, "drain_signal": self.signal,
                "drain_signal_all_steps": self.signal_all_steps}


def modes_for(action):
    """The drain modes an approver may choose for the action."""
    return (DrainMode.NO_DRAIN,) if action in IN_SERVICE_ACTIONS else TAKING_THE_NODE_OUT


def default_mode(signature, action):
    if action in IN_SERVICE_ACTIONS:
        return DrainMode.NO_DRAIN
    info = info_for(signature)
    return info.drain if info is not None and info.drain else FALLBACK_MODE


LOOK_UP = object()  # plan_for(policy=...): not given, read it


def plan_for(cluster, signature, action, mode=None, policy=LOOK_UP):
    """The DrainPlan of a repair of `action` for `signature` on the cluster: in `mode` when
    the approver chose one, else the policy's mode, else the catalog's. The policy's
    deadline and what happens at it apply to the policy's own mode; another mode gets its
    defaults. policy: the cluster's RepairPolicy for the signature, or None when it has
    none (read when not given)."""
    if action in IN_SERVICE_ACTIONS:
        return DrainPlan(DrainMode.NO_DRAIN)
    row = policy if policy is not LOOK_UP else RepairPolicy.objects.filter(
        cluster=cluster, signature=signature).first()
    policy_mode = (row.drain_mode if row is not None and row.drain_mode
                   else default_mode(signature, action))
    chosen = mode or policy_mode
    if chosen not in TAKING_THE_NODE_OUT:
        raise ValueError(f"{chosen!r} is not a drain mode for a {action}")
    if chosen == DrainMode.NOW:
        return DrainPlan(DrainMode.NOW)
    own = row is not None and chosen == policy_mode
    deadline_s = (row.drain_deadline_s if own and row.drain_deadline_s
                  else DEFAULT_DRAIN_DEADLINE_S[chosen])
    if chosen == DrainMode.AFTER_JOBS:
        at_deadline = (row.drain_at_deadline if own and row.drain_at_deadline
                       else AtDeadline.KEEP_WAITING)
        return DrainPlan(chosen, deadline_s, at_deadline=at_deadline)
    signal = (row.drain_signal if row is not None and row.drain_signal else DEFAULT_DRAIN_SIGNAL)
    return DrainPlan(chosen, deadline_s, signal=signal,
                     signal_all_steps=row is not None and row.drain_signal_all_steps)


def plan_of(repair):
    """The DrainPlan a repair carries."""
    if repair.action in IN_SERVICE_ACTIONS or repair.drain_mode == DrainMode.NO_DRAIN:
        return DrainPlan(DrainMode.NO_DRAIN)
    mode = repair.drain_mode or FALLBACK_MODE
    if mode == DrainMode.NOW:
        return DrainPlan(mode)
    deadline_s = repair.drain_deadline_s or DEFAULT_DRAIN_DEADLINE_S[mode]
    if mode == DrainMode.AFTER_JOBS:
        return DrainPlan(mode, deadline_s,
                         at_deadline=repair.drain_at_deadline or AtDeadline.KEEP_WAITING)
    return DrainPlan(mode, deadline_s, signal=repair.drain_signal or DEFAULT_DRAIN_SIGNAL,
                     signal_all_steps=repair.drain_signal_all_steps)


def jobs_end_by(jobs, read_at):
    """When the last of the jobs reaches its time limit (their time left as the scheduler
    read it at read_at), or None when one has no limit or it is unknown."""
    left = [job.time_left_s for job in jobs]
    if not left or any(seconds is None for seconds in left):
        return None
    return read_at + timedelta(seconds=max(left))
