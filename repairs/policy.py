"""Which repair a failure calls for (DESIGN.md "Repairs"): the lightest rung of the
signature's ladder, climbed by the node's history, each choice with why in words.

Ladders, cheapest first, come from data: healthchecks/data/signatures.tsv for each
signature, healthchecks/data/xid_buckets.tsv for an Xid by NVIDIA's action bucket (for the
GPU's model). A cluster's policy row for a signature sets the first rung; the default
ladder's costlier rungs follow it. Throttling calls for its repair only once it has lasted
THROTTLE_PERSISTS.

A ladder climbs within its own list: when a repair of the same signature on the node ran
within ESCALATION_WINDOW and the signal is still there (still open, or back), the next rung
is chosen, and the choice names the repair it follows.

Count windows (the cluster's RepairSettings) can only raise the action, and only for faults
that take the node out: N fatal Xids on one GPU within hours, or N repairs of the node
within days. An occurrence is an event frame the agent sent (its receipt): a burst the agent
coalesced into one frame is one, and Xids that call for no repair (an application's fault)
never count, so a storm of a benign Xid never trips a window. In record-only mode a tripped
window changes nothing and the recommendation says what it would have been.
"""

from dataclasses import dataclass, replace
from datetime import timedelta

from django.db.models import Exists, OuterRef

from common.durations import duration_text
from healthchecks.signatures import info_for
from healthchecks.xid_catalog import (
    nvlink_of,
    policy_for,
    recovery_action_of,
    why_sentence,
    xid_code,
)
from nodes.models import AgentEventReceipt

from .choices import (ACTION_EXPLANATIONS, GPU_ACTIONS, IN_SERVICE_ACTIONS, StepKind,
                      StepStatus, cost)
from .models import Repair, RepairStep

THROTTLE_SIGNATURES = ("thermal_throttle", "hw_slowdown", "power_brake")
THROTTLE_PERSISTS = timedelta(minutes=15)
ESCALATION_WINDOW = timedelta(days=7)
COOLDOWN = timedelta(minutes=30)


@dataclass(frozen=True)
class Ladder:
    actions: tuple  # cheapest first; () for no repair
    why: str  # why the first rung fixes it, or why there is no repair
    lighter: str = ""  # why nothing lighter than the first rung is enough


@dataclass(frozen=True)
class Choice:
    action: str
    why: str
    ladder: tuple = ()
    follows: Repair | None = None  # the lighter repair that did not fix it
    follows_why: str = ""  # what became of that one, in words
    would_have: str = ""  # a record-only count window: what it would have recommended


def default_ladder(signature, gpu_model=""):
    """The Ladder of the catalogs for a signature (an Xid's for the GPU's model)."""
    code = xid_code(signature)
    if code is not None:
        policy = policy_for(code, gpu_model)
        return Ladder(policy.ladder, why_sentence(code, gpu_model), policy.lighter)
    info = info_for(signature)
    if info is None:
        return Ladder((), f"No repair by default: {signature} is not in clusterui's signature "
                          f"catalog; an operator decides.")
    name = signature.partition(":")[2]
    return Ladder(info.ladder, info.why.format(name=name), info.lighter)


def ladder_for(signature, gpu_model, row):
    """The Ladder for a signature on a cluster: row is the cluster's RepairPolicy for it, or
    None (or a row that sets only how its repairs drain) for the default."""
    default = default_ladder(signature, gpu_model)
    if row is None or row.action is None:
        return default
    who = row.updated_by.get_username() if row.updated_by_id else "an admin"
    if not row.action:
        return Ladder((), f"No repair: this cluster's policy turns repairs of {signature} off "
                          f"(set by {who}).")
    costlier = tuple(action for action in default.actions if cost(action) > cost(row.action))
    why = (f"This cluster's policy starts {signature} at {row.action} (set by {who}): "
           f"{ACTION_EXPLANATIONS[row.action]}.")
    return Ladder((row.action, *costlier), why)


def event_ladder(event, model):
    """The default Ladder for one event: what its evidence names can choose it (the
    recovery action of an Xid 154 or a gpu_recovery_action), or say where (the NVLink of
    an Xid 74)."""
    evidence = event.evidence or {}
    if event.signature in ("xid:154", "gpu_recovery_action"):
        recovery = recovery_action_of(evidence)
        if recovery is not None:
            return Ladder(recovery.ladder, f"The driver asks: {recovery.nvidia_says} "
                                           f"({recovery.name}). {recovery.why}")
    ladder = default_ladder(event.signature, model)
    if event.signature == "xid:74":
        link = nvlink_of(evidence.get("kernel_line") or event.message)
        if link is not None:
            return replace(ladder, why=f"{ladder.why} The error is on NVLink {link}.")
    return ladder


def choose_action(event, policies, now):
    """The Choice for one open event, or None. policies: {signature: RepairPolicy} of the
    node's cluster."""
    model = event.gpu.name if event.gpu is not None else ""
    row = policies.get(event.signature)
    ladder = (event_ladder(event, model) if row is None or row.action is None
              else ladder_for(event.signature, model, row))
    if event.gpu is None:  # a node-level signal: no GPU to reset
        ladder = replace(ladder, actions=tuple(a for a in ladder.actions if a not in GPU_ACTIONS))
    if not ladder.actions:
        return None
    if event.signature in THROTTLE_SIGNATURES and now - event.first_seen < THROTTLE_PERSISTS:
        return None  # throttling calls for a repair only once it persists
    return Choice(ladder.actions[0], ladder.why, ladder.actions)


def next_rung(ladder, after):
    """The ladder's first rung costlier than `after`; the top rung stays the top."""
    return next((action for action in ladder if cost(action) > cost(after)), ladder[-1])


def escalate(node, event, choice, now):
    """The next rung of the ladder when a repair of the same signature on this node ran
    within ESCALATION_WINDOW and the signal is still there or came back."""
    last = (Repair.objects.filter(node=node, signature=event.signature,
                                  finished_at__isnull=False, started_at__isnull=False,
                                  finished_at__gte=now - ESCALATION_WINDOW)
            .order_by("-finished_at").first())
    if last is None:
        return choice
    stronger = next_rung(choice.ladder, last.action)
    if cost(stronger) <= cost(choice.action):
        return choice
    if event.first_seen <= last.finished_at:
        what = (f"{event.signature} is still open after repair #{last.pk} ({last.action}, "
                f"{last.get_status_display()})")
    else:
        after = duration_text((event.first_seen - last.finished_at).total_seconds())
        what = f"{event.signature} came back {after} after repair #{last.pk} ({last.action})"
    return Choice(stronger, f"{what}: the next rung is {stronger}, "
                            f"{ACTION_EXPLANATIONS[stronger]}.",
                  choice.ladder, follows=last, follows_why=what)


def gpu_window(event, settings, now):
    """Why the GPU's count window (fatal Xids on it within hours) trips for this event, or
    ""."""
    if event.gpu_id is None or xid_code(event.signature) is None:
        return ""
    since = now - timedelta(hours=settings.xid_window_hours)
    signatures = AgentEventReceipt.objects.filter(
        health_event__gpu_id=event.gpu_id, health_event__signature__startswith="xid:",
        received_at__gte=since).values_list("health_event__signature", flat=True)
    model = event.gpu.name
    fatal = sum(1 for signature in signatures
                if policy_for(xid_code(signature), model).recommendation)
    if fatal < settings.xid_window_count:
        return ""
    return (f"{fatal} fatal Xids on GPU {event.gpu.index} in {settings.xid_window_hours} h "
            f"(the window trips at {settings.xid_window_count})")


def node_window(node, settings, now):
    """Why the node's count window (repairs of it within days) trips, or "": the same for
    every event of the node, so read once per recommendation."""
    if settings.window_mode == settings.WindowMode.OFF:
        return ""
    repairs = (Repair.objects.filter(node=node, started_at__gte=now - timedelta(
        days=settings.repair_window_days)).exclude(action__in=IN_SERVICE_ACTIONS).count())
    if repairs < settings.repair_window_count:
        return ""
    return (f"{repairs} repairs of {node.name} in {settings.repair_window_days} days (the "
            f"window trips at {settings.repair_window_count})")


def apply_windows(event, choice, settings, node_why, now):
    """The choice, raised (or, record-only, annotated) by a tripped count window: the
    GPU's for this event, else the node's (node_why, node_window()). Faults whose ladder
    keeps the node in service (a clean-up) are left alone."""
    if settings.window_mode == settings.WindowMode.OFF:
        return choice
    if all(action in IN_SERVICE_ACTIONS for action in choice.ladder):
        return choice
    why = gpu_window(event, settings, now) or node_why
    action = settings.window_action
    if not why or cost(action) <= cost(choice.action):
        return choice
    if settings.window_mode == settings.WindowMode.RECORD_ONLY:
        return replace(choice, would_have=f"would have recommended {action}: {why}")
    return Choice(action, f"{why}: {action}, {ACTION_EXPLANATIONS[action]}.", choice.ladder,
                  choice.follows, choice.follows_why)


def in_cooldown(node, now):
    """A repair that took the node out of service and acted ended less than COOLDOWN ago.
    A clean-up or a reconfigure does not count, nor a repair whose act failed (a GPU reset
    the agent refused): nothing was done, so the next rung may follow at once."""
    refused = RepairStep.objects.filter(repair=OuterRef("pk"), kind=StepKind.ACT,
                                        status=StepStatus.FAILED)
    return (Repair.objects.filter(node=node, started_at__isnull=False,
                                  finished_at__gte=now - COOLDOWN)
            .exclude(action__in=IN_SERVICE_ACTIONS).exclude(Exists(refused)).exists())
