"""Writes for repairs: recommending, proposing, approving, rejecting, cancelling, starting.
Status moves go through repairs.transitions.transition(); running is repairs.steps'."""

import logging
import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from celery import current_app
from django.conf import settings as django_settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.http import HttpRequest
from django.utils import timezone

from clusters.change_feed import Kind, read_changes
from clusters.models import Cluster
from clusters.services import record_audit
from common.durations import duration_text
from healthchecks.choices import NODE_AFFECTING
from healthchecks.models import HealthEvent
from healthchecks.services import open_problem_events, open_problem_events_of
from nodes import maintenance
from nodes.choices import NodeState
from nodes.models import Node

from .choices import (AGENT_ACTIONS, IN_SERVICE_ACTIONS, STEPS, DrainMode, Status, StepKind,
                      StepStatus, cost)
from .announcements import announce_repair_change
from .drain_modes import modes_for, plan_for, plan_of
from .models import Repair, RepairPolicy, RepairSettings, RepairStep
from .policy import Choice, apply_windows, choose_action, escalate, in_cooldown, node_window
from .rejections import holds_back, rejections_in_force, what_is_new
from .transitions import Conflict, transition

logger = logging.getLogger(__name__)

RESOLVE_AFTER = timedelta(minutes=5)
# A step due within this much of a beat tick runs at that tick: a step that asks to be
# looked at again in 5 s must not miss the tick 5 s later by a few milliseconds.
DUE_EARLY = timedelta(seconds=1)
# A next step is enqueued when the one before it ends; one still pending this long after
# has lost its message (a broker restart) and the beat enqueues it again.
PENDING_STALLS_AFTER = timedelta(minutes=1)


class RepairRefused(Exception):
    """A person asked for something the rules do not allow; str() says why."""


def settings_for(cluster):
    settings, _ = RepairSettings.objects.get_or_create(cluster=cluster)
    return settings


@dataclass(frozen=True)
class Recommendation:
    choice: Choice  # the costliest of the node's open problems
    event: HealthEvent  # the event it answers
    events: list  # the node's open problems
    driving: list  # those of them that call for a repair


def recommendation_for(node, now):
    """The Recommendation for the node's open problems, the costliest first; None when none
    calls for a repair."""
    policies = {p.signature: p for p in
                RepairPolicy.objects.filter(cluster=node.cluster).select_related("updated_by")}
    events = open_problem_events(node, now)
    settings = settings_for(node.cluster)
    node_why = node_window(node, settings, now)
    best, driving = None, []
    for event in events:
        choice = choose_action(event, policies, now)
        if choice is None:
            continue
        driving.append(event)
        choice = escalate(node, event, choice, now)
        choice = apply_windows(event, choice, settings, node_why, now)
        if best is None or cost(choice.action) > cost(best[0].action):
            best = (choice, event)
    if best is None:
        return None
    return Recommendation(best[0], best[1], events, driving)


def held_back(node, found, now):
    """(whether a rejection in force holds back `found`, the rejection it follows or None)."""
    rejections = rejections_in_force(node, now)
    if any(holds_back(r, found.choice.action, found.driving) for r in rejections):
        return True, None
    return False, (rejections[0] if rejections else None)


@transaction.atomic
def refresh_recommendation(node, now=None):
    """Recommend a repair for the node's open problems, following DESIGN.md: one open repair
    per node; a costlier recommendation supersedes a proposed one; none while the node is in
    cooldown, a repair is already approved or running, or a rejection holds it back
    (repairs.rejections). Returns the node's open repair."""
    now = now or timezone.now()
    node = (Node.objects.select_for_update(of=("self",), no_key=True)
            .select_related("cluster").get(pk=node.pk))
    current = node.repairs.open().first()
    if current is not None and current.status != Status.PROPOSED:
        return current
    if in_cooldown(node, now):
        return current
    if maintenance.occurrence_for(node, now) is not None:
        return current  # nothing is recommended for a node in maintenance
    found = recommendation_for(node, now)
    if found is None:
        return current
    choice = found.choice
    if current is not None and cost(choice.action) <= cost(current.action):
        current.events.add(*found.events)
        if choice.would_have and choice.would_have != current.would_have:
            Repair.objects.filter(pk=current.pk).update(would_have=choice.would_have[:500])
        return current
    follows, follows_why = choice.follows, choice.follows_why
    if current is None:
        held, rejection = held_back(node, found, now)
        if held:
            return None
        if rejection is not None:
            follows = rejection
            follows_why = what_is_new(rejection, choice.action, found.driving)
    if current is not None:
        transition(current, Status.SUPERSEDED,
                   reason=f"a costlier repair ({choice.action}) is needed", now=now)
    policy = RepairPolicy.objects.filter(cluster=node.cluster,
                                         signature=found.event.signature).first()
    plan = plan_for(node.cluster, found.event.signature, choice.action, policy=policy)
    repair = Repair.objects.create(
        cluster=node.cluster, node=node, gpu=found.event.gpu, action=choice.action,
        signature=found.event.signature, reason=choice.why, requested_at=now,
        boot_id_before=node.boot_id, follows=follows, follows_why=follows_why[:500],
        would_have=choice.would_have[:500], **plan.as_fields())
    repair.events.add(*found.events)
    if current is not None:
        Repair.objects.filter(pk=current.pk).update(superseded_by=repair)
    announce_repair_change(repair)
    if policy is not None and policy.auto_approve and policy.action == choice.action:
        repair = transition(repair, Status.APPROVED, reason=f"auto-approved: the cluster's "
                            f"policy for {found.event.signature}", now=now, auto_approved=True,
                            reviewed_at=now)
        start_repair(repair, now=now)
    return repair


def with_a_candidate(node_ids, now):
    """The nodes, of node_ids, with an open problem that calls for a repair (policy.
    choose_action), in id order: read in three queries for them all, locking nothing. For
    the others refresh_recommendation() would change nothing, so a storm of events that
    call for no repair (throttling that has not persisted yet) costs no node a lock."""
    problems = open_problem_events_of(node_ids, now)
    cluster_of = dict(Node.objects.filter(pk__in=list(node_ids)).values_list("pk", "cluster_id"))
    policies = {}
    for policy in RepairPolicy.objects.filter(cluster_id__in=set(cluster_of.values())):
        policies.setdefault(policy.cluster_id, {})[policy.signature] = policy
    return sorted(node_id for node_id, events in problems.items() if node_id in cluster_of
                  and any(choose_action(event, policies.get(cluster_of[node_id], {}), now)
                          for event in events))


def _refresh_recommendations_of(node_ids, now):
    """refresh_recommendation() for each node with a candidate repair, each on its own: one
    that fails is logged and the others go on (the sweep tries it again). Returns how many
    got a new repair."""
    recommended = 0
    for node in Node.objects.filter(pk__in=with_a_candidate(node_ids, now)).order_by("pk"):
        before = node.repairs.open().values_list("pk", flat=True).first()
        try:
            after = refresh_recommendation(node, now=now)
        except Exception:
            logger.exception("recommending a repair for node %s failed", node.pk)
            continue
        recommended += after is not None and after.pk != before
    return recommended


RECOMMENDER = "recommender"


def recommend_from_changes(now=None):
    """The recommender, once per tick: the nodes whose health events opened or closed since
    its last read (the change feed), each refreshed once however many events it had, in a
    transaction of its own (one transaction for them all would hold every node's row until
    the last one is done). Returns how many got a new repair.

    The feed's cursor moves first: a worker lost in the middle leaves its nodes to the
    minute's sweep (refresh_recommendations)."""
    now = now or timezone.now()
    with transaction.atomic():
        node_ids = {change.node_id for change in read_changes(RECOMMENDER)
                    if change.kind == Kind.HEALTH_EVENT and change.node_id is not None}
    return _refresh_recommendations_of(node_ids, now)


def refresh_recommendations(now=None):
    """Beat, every minute: recommend for every node with open problems, for what time alone
    changes (a cooldown that ended). Returns how many got a new repair."""
    now = now or timezone.now()
    node_ids = (HealthEvent.objects.open().filter(severity__in=NODE_AFFECTING)
                .values_list("node_id", flat=True).distinct())
    return _refresh_recommendations_of(set(node_ids), now)


def resolve_quiet_recommendations(now=None):
    """Proposals whose events have all been closed for 5 minutes resolve themselves."""
    now = now or timezone.now()
    resolved = 0
    for repair in Repair.objects.filter(status=Status.PROPOSED).prefetch_related("events"):
        events = list(repair.events.all())
        if not events or any(e.closed_at is None for e in events):
            continue
        if max(e.closed_at for e in events) > now - RESOLVE_AFTER:
            continue
        try:
            transition(repair, Status.RESOLVED, now=now,
                       reason="its events closed and stayed closed for 5 minutes",
                       finished_at=now, outcome="resolved before anyone acted")
            resolved += 1
        except Conflict:
            pass
    return resolved


@transaction.atomic
def do_propose_repair(node: Node, *, action, actor: AbstractBaseUser, reason,
                      request: HttpRequest | None = None, now: datetime | None = None) -> Repair:
    """An operator proposes a repair by hand; it waits for approval like any other."""
    now = now or timezone.now()
    node = (Node.objects.select_for_update(of=("self",), no_key=True)
            .select_related("cluster").get(pk=node.pk))
    current = node.repairs.open().first()
    if current is not None:
        raise RepairRefused(f"{node.name} already has repair #{current.pk} "
                            f"({current.action}, {current.get_status_display()})")
    try:
        with transaction.atomic():
            repair = Repair.objects.create(
                cluster=node.cluster, node=node, action=action, signature="manual",
                reason=f"proposed by {actor.get_username()}: {reason}", requested_by=actor,
                requested_at=now, boot_id_before=node.boot_id,
                **plan_for(node.cluster, "manual", action).as_fields())
    except IntegrityError:
        raise RepairRefused(f"{node.name} already has an open repair") from None
    repair.events.add(*node.health_events.open())
    record_audit(actor, "repair.propose", repair, cluster=node.cluster, request=request,
                 changes={"action": action, "reason": reason}, now=now)
    announce_repair_change(repair)
    return repair


@transaction.atomic
def do_approve_repair(repair, *, actor: AbstractBaseUser, comment="", seen: dict | None = None,
                      confirmed_unknown_jobs=False, drain_mode=None,
                      request: HttpRequest | None = None,
                      now: datetime | None = None) -> Repair:
    """Approve a proposed repair and start it (or let it wait for the blast-radius limit).
    `seen`: what the card showed the approver about its cost (RepairCard.approval_record),
    kept with the repair. When the scheduler could not be read, nobody knows which jobs it
    stops: the approver must say so (confirmed_unknown_jobs), or it is refused.
    `drain_mode`: the approver's choice of how the jobs are treated, when it is not the
    repair's own (repairs.drain_modes). Two operators approving at once: one wins, the
    other gets Conflict."""
    now = now or timezone.now()
    seen = dict(seen or {})
    if seen.get("error") and not confirmed_unknown_jobs:
        raise RepairRefused(f"the scheduler could not be read ({seen['error']}), so nobody "
                            f"can say which jobs this repair stops: confirm to approve anyway")
    plan = plan_of(repair)
    changes = {"comment": comment}
    if drain_mode and drain_mode != plan.mode:
        if drain_mode not in modes_for(repair.action):
            raise RepairRefused(f"a {repair.action} cannot drain {DrainMode(drain_mode).label!r}"
                                if drain_mode in DrainMode.values else
                                f"{drain_mode!r} is not a drain mode")
        changes["drain_mode"] = {"before": plan.mode, "after": drain_mode}
        plan = plan_for(repair.cluster, repair.signature, repair.action, mode=drain_mode)
    seen["drain"] = plan.words
    repair = transition(repair, Status.APPROVED, actor=actor, reason=comment or "approved",
                        now=now, reviewed_by=actor, reviewed_at=now, review_comment=comment,
                        approval_view=seen, **plan.as_fields())
    if seen.get("error"):
        changes["approved_without_knowing_the_jobs"] = seen["error"]
    record_audit(actor, "repair.approve", repair, cluster=repair.cluster, request=request,
                 changes=changes, now=now)
    return start_repair(repair, now=now)


@transaction.atomic
def do_reject_repair(repair, *, actor: AbstractBaseUser, comment="",
                     snooze: timedelta | None = None, request: HttpRequest | None = None,
                     now: datetime | None = None) -> Repair:
    """No to a proposed repair. It sticks (repairs.rejections): nothing is proposed again
    for its events until they close, or for `snooze` when one is given."""
    now = now or timezone.now()
    repair = transition(repair, Status.REJECTED, actor=actor, reason=comment or "rejected",
                        now=now, reviewed_by=actor, reviewed_at=now, review_comment=comment,
                        finished_at=now, outcome="rejected", snooze_until=snooze_end(snooze, now))
    record_audit(actor, "repair.reject", repair, cluster=repair.cluster, request=request,
                 changes={"comment": comment, "snooze": snooze_words(snooze)}, now=now)
    return repair


@transaction.atomic
def do_cancel_repair(repair, *, actor: AbstractBaseUser, comment="",
                     snooze: timedelta | None = None, request: HttpRequest | None = None,
                     now: datetime | None = None) -> Repair:
    """Proposed, approved or waiting repairs can be cancelled; a running one cannot. A
    cancellation sticks as a rejection does."""
    now = now or timezone.now()
    repair = transition(repair, Status.CANCELLED, actor=actor, reason=comment or "cancelled",
                        now=now, finished_at=now, outcome=f"cancelled by {actor.get_username()}",
                        snooze_until=snooze_end(snooze, now))
    record_audit(actor, "repair.cancel", repair, cluster=repair.cluster, request=request,
                 changes={"comment": comment, "snooze": snooze_words(snooze)}, now=now)
    return repair


def snooze_end(snooze, now):
    return None if snooze is None else now + snooze


def snooze_words(snooze):
    return "until its events close" if snooze is None else duration_text(snooze.total_seconds())


@transaction.atomic
def do_recommend_again(node: Node, *, actor: AbstractBaseUser,
                       request: HttpRequest | None = None,
                       now: datetime | None = None) -> Repair | None:
    """An operator asks for a recommendation again: the snoozes of the node's rejected and
    cancelled repairs end now, and the recommender looks at the node at once. Returns its
    open repair (None when nothing calls for one)."""
    now = now or timezone.now()
    ended = [r.pk for r in rejections_in_force(node, now)]
    Repair.objects.filter(pk__in=ended).update(snooze_until=now)
    record_audit(actor, "repair.recommend_again", node, cluster=node.cluster, request=request,
                 changes={"snoozes_ended": ended}, now=now)
    return refresh_recommendation(node, now=now)


@dataclass(frozen=True)
class BlastRadius:
    """How many of the cluster's nodes are out of service (paused, or under a repair that
    took them out) besides one node, and the cluster's limit."""

    out: int
    total: int
    pct: int

    @property
    def limit(self):
        return max(1, math.floor(self.total * self.pct / 100))

    @property
    def allows(self):
        """Whether the node may go out too."""
        return self.out + 1 <= self.limit

    @property
    def text(self):
        """The card's line: the count once this repair has taken its node out."""
        return (f"{self.out + 1} of {self.total} nodes out of service after it; limit "
                f"{self.pct} % ({self.limit} node{'s' if self.limit != 1 else ''})")

    @property
    def verdict(self):
        """None when the repair may start now, else why it waits."""
        if self.allows:
            return None
        return (f"{self.out} of {self.total} nodes are out of service (paused or under "
                f"repair); the limit is {self.pct} % ({self.limit} node"
                f"{'s' if self.limit != 1 else ''})")


@dataclass(frozen=True)
class OutOfService:
    node_ids: frozenset
    total: int
    pct: int

    def after(self, node_id):
        """The BlastRadius for taking node_id out."""
        return BlastRadius(len(self.node_ids - {node_id}), self.total, self.pct)


def out_of_service(cluster):
    """The cluster's nodes out of service now: paused, or under a running repair that took
    them out (a clean-up or a reconfigure leaves its node in)."""
    nodes = Node.objects.filter(cluster=cluster)
    under_repair = (Repair.objects.filter(cluster=cluster, status=Status.RUNNING)
                    .exclude(action__in=IN_SERVICE_ACTIONS).values("node"))
    out = nodes.filter(Q(state=NodeState.PAUSED) | Q(pk__in=under_repair))
    return OutOfService(frozenset(out.values_list("pk", flat=True)), nodes.count(),
                        settings_for(cluster).blast_radius_pct)


def blast_radius_verdict(repair):
    """None when the repair may start now, else why it waits."""
    return out_of_service(repair.cluster).after(repair.node_id).verdict


@transaction.atomic
def start_repair(repair, now=None):
    """Run an approved or waiting repair now, or hold it back (waiting) while the
    blast-radius limit says so. Returns the repair."""
    now = now or timezone.now()
    node = Node.objects.select_for_update(no_key=True).get(pk=repair.node_id)
    # The cluster-wide lock (after the node's, the order every path takes): the blast-radius
    # count and the decision to start are one at a time per cluster, so starts at once on
    # several workers never put more than the limit out of service.
    Cluster.objects.select_for_update(no_key=True).only("pk").get(pk=repair.cluster_id)
    repair.refresh_from_db()
    if repair.status not in (Status.APPROVED, Status.WAITING):
        return repair
    in_maintenance = maintenance.occurrence_for(node, now)
    if in_maintenance is not None:
        why_wait = f"{node.name} is in {maintenance.describe(in_maintenance)}"
    elif repair.action in IN_SERVICE_ACTIONS:
        why_wait = None  # the node stays in service: nothing to count
    else:
        why_wait = blast_radius_verdict(repair)
    if why_wait is not None:
        if repair.status == Status.APPROVED:
            return transition(repair, Status.WAITING, reason=why_wait, now=now,
                              waiting_reason=why_wait)
        if why_wait != repair.waiting_reason:
            Repair.objects.filter(pk=repair.pk).update(waiting_reason=why_wait)
            announce_repair_change(repair)
        return repair
    repair = transition(repair, Status.RUNNING, reason="started", now=now, started_at=now,
                        waiting_reason="", boot_id_before=node.boot_id)
    RepairStep.objects.bulk_create([
        RepairStep(repair=repair, position=position, kind=kind)
        for position, kind in enumerate(STEPS[repair.action])
    ])
    first = repair.steps.get(position=0)
    enqueue_step(first.pk)
    return repair


# By name: the domain never imports a task module (repairs.tasks calls into it).
RUN_STEP_TASK = "repairs.tasks.run_repair_step"


def step_queue(kind, action):
    """The provider's commands (a reprovision, a failover, a removal: minutes) have a queue
    of their own; every other step is short."""
    if kind == StepKind.ACT and action not in AGENT_ACTIONS:
        return django_settings.PROVIDER_QUEUE
    return django_settings.CELERY_TASK_DEFAULT_QUEUE


def enqueue_step(step_id):
    """Once committed, a worker runs the step (repairs.tasks.run_repair_step)."""
    kind, action = RepairStep.objects.values_list("kind", "repair__action").get(pk=step_id)
    queue = step_queue(kind, action)
    transaction.on_commit(
        lambda: current_app.send_task(RUN_STEP_TASK, args=[step_id], queue=queue))


def start_waiting_repairs(now=None):
    """Beat: waiting repairs start once the blast-radius limit lets them (oldest first)."""
    started = 0
    for repair in Repair.objects.filter(status=Status.WAITING).order_by("reviewed_at", "id"):
        started += start_repair(repair, now=now).status == Status.RUNNING
    return started


def due_steps(now=None):
    """Beat: ids of the steps to run now: waiting steps whose next check has come, running
    steps whose lease ran out (their worker died and its delivery was lost), and a next step
    still pending a minute after the one before it ended (its enqueue was lost)."""
    now = now or timezone.now()
    due = list(RepairStep.objects.filter(repair__status=Status.RUNNING).filter(
        Q(status=StepStatus.WAITING, next_check_at__lte=now + DUE_EARLY)
        | Q(status=StepStatus.RUNNING, lease_until__lte=now)
    ).values_list("pk", flat=True))
    for repair in Repair.objects.filter(status=Status.RUNNING).prefetch_related("steps"):
        steps = sorted(repair.steps.all(), key=lambda step: step.position)
        current = next((step for step in steps if step.status != StepStatus.DONE), None)
        if current is None or current.status != StepStatus.PENDING:
            continue
        ended = [step.finished_at for step in steps if step.finished_at] or [repair.started_at]
        if max(ended) <= now - PENDING_STALLS_AFTER:
            due.append(current.pk)
    return due


# Settings and policy: admins' changes, each audited.

SETTINGS_FIELDS = ("provider", "provider_commands",
                   "blast_radius_pct", "boot_timeout_s", "window_mode",
                   "window_action", "xid_window_count", "xid_window_hours",
                   "repair_window_count", "repair_window_days")


@transaction.atomic
def do_update_repair_settings(form, *, actor: AbstractBaseUser, request: HttpRequest | None = None,
                              now: datetime | None = None) -> list[str]:
    """Save an edited RepairSettingsForm; the audit entry holds each changed field
    before/after. Returns the names of the changed fields."""
    stored = RepairSettings.objects.select_for_update().get(pk=form.instance.pk)
    before = {name: getattr(stored, name) for name in SETTINGS_FIELDS}
    settings = form.save()
    settings.refresh_from_db()
    after = {name: getattr(settings, name) for name in SETTINGS_FIELDS}
    changed = {name: {"before": before[name], "after": after[name]}
               for name in SETTINGS_FIELDS if before[name] != after[name]}
    if changed:
        record_audit(actor, "repairsettings.update", settings, changes=changed,
                     cluster=settings.cluster, request=request, now=now)
    return list(changed)


# A policy row's drain fields when it leaves drains to the defaults.
DEFAULT_DRAIN_FIELDS = {"drain_mode": "", "drain_deadline_s": None, "drain_at_deadline": "",
                        "drain_signal": "", "drain_signal_all_steps": False}


@transaction.atomic
def do_set_repair_policy(cluster: Cluster, signature, *, action, auto_approve,
                         drain: dict | None = None, actor: AbstractBaseUser,
                         request: HttpRequest | None = None,
                         now: datetime | None = None) -> bool:
    """The cluster's policy for one signature. action: an Action, "" for no repair, or None
    for the default ladder. drain: the row's drain fields (DEFAULT_DRAIN_FIELDS' keys;
    None: the defaults). A row that sets nothing is dropped (the defaults of repairs.policy
    and repairs.drain_modes apply again). Returns whether anything changed."""
    row = RepairPolicy.objects.select_for_update().filter(cluster=cluster,
                                                          signature=signature).first()
    drain = {**DEFAULT_DRAIN_FIELDS, **(drain or {})}
    before = None if row is None else {
        "action": row.action, "auto_approve": row.auto_approve,
        **{name: getattr(row, name) for name in DEFAULT_DRAIN_FIELDS}}
    after = {"action": action, "auto_approve": auto_approve, **drain}
    if after == {"action": None, "auto_approve": False, **DEFAULT_DRAIN_FIELDS}:
        after = None
    if before == after:
        return False
    changes = {"signature": signature, "before": before, "after": after}
    if after is None:
        record_audit(actor, "repairpolicy.delete", row, changes=changes, cluster=cluster,
                     request=request, now=now)
        row.delete()
        return True
    row, _ = RepairPolicy.objects.update_or_create(
        cluster=cluster, signature=signature, defaults={**after, "updated_by": actor})
    record_audit(actor, "repairpolicy.update", row, changes=changes, cluster=cluster,
                 request=request, now=now)
    return True
