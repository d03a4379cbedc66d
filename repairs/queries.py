"""The reads behind the Repair tab, a repair's page and the node page's Repair section:
repair cards with what they show (the jobs a repair would hit, the node's earlier repairs),
in a fixed number of queries."""

from dataclasses import dataclass, fields, replace
from datetime import datetime, timedelta
from uuid import UUID

from django.core.cache import cache
from django.db.models import Count, F, Prefetch, Q, Window
from django.db.models.functions import RowNumber
from django.http import HttpRequest
from django.shortcuts import get_object_or_404
from django.utils import timezone

from clusters.queries import clusters_for_user, get_cluster_for_user
from healthchecks.check_catalog import CHECKS
from healthchecks.signatures import NOTICES, SIGNATURES
from healthchecks.xid_catalog import catalog, policy_for
from healthchecks.models import HealthEvent
from nodes.models import Gpu
from schedulers import ExecutorError, Job, NoScheduler, scheduler_for

from .choices import (
    ACTION_EXPLANATIONS,
    DRAIN_MODE_EXPLANATIONS,
    FINISHED_STATUSES,
    IN_SERVICE_ACTIONS,
    Action,
    DrainMode,
    Status,
)
from .drain_modes import DrainPlan, jobs_end_by, modes_for, plan_for, plan_of
from .forms import CommentForm, ProposeRepairForm
from .models import Repair, RepairPolicy
from .policy import Ladder, default_ladder
from .rejections import rejections_in_force
from .services import BlastRadius, out_of_service

NODE_HISTORY_LIMIT = 5  # a recommendation shows this many of its node's earlier repairs
NODE_PAGE_HISTORY_LIMIT = 20


def get_repair_for_user(request: HttpRequest, slug: str, public_id: UUID) -> Repair:
    cluster = get_cluster_for_user(request, slug)
    return get_object_or_404(with_card_data(Repair.objects.all()), cluster=cluster,
                             public_id=public_id)


def with_card_data(repairs):
    """What a repair's block shows, fetched with it: a fixed number of queries for any
    number of repairs."""
    return repairs.select_related(
        "cluster", "node", "gpu", "requested_by", "reviewed_by", "follows__cluster",
    ).prefetch_related(
        Prefetch("events", queryset=HealthEvent.objects.select_related("gpu").order_by(
            "-last_seen", "-id")),
        "steps",
    )


# What a repair's block shows besides the repair itself.


JOBS_FRESH_FOR_S = 30  # a card's jobs are the scheduler's answer of at most this long ago


@dataclass(frozen=True)
class JobRow:
    job: Job
    since: datetime | None  # running since
    gpu_hours: str
    other_nodes: tuple  # the job's nodes besides this one


@dataclass(frozen=True)
class JobsAtRisk:
    """What the cluster's scheduler says runs on a node: the jobs a repair would hit."""

    node: str = ""
    jobs: tuple = ()
    scheduler: str = ""  # its name; "" when the cluster has none configured
    error: str = ""  # why it did not answer
    read_at: datetime | None = None

    @property
    def rows(self):
        return [JobRow(job, None if job.run_time_s is None or self.read_at is None
                       else self.read_at - timedelta(seconds=job.run_time_s),
                       "–" if job.gpu_hours is None else f"{job.gpu_hours:,.1f}",
                       tuple(name for name in job.nodes if name != self.node))
                for job in self.jobs]

    @property
    def nodes_hit(self):
        """Every node whose work the repair stops: this one and the other nodes of its
        multi-node jobs."""
        return sorted({self.node, *(name for job in self.jobs for name in job.nodes)})

    @property
    def unknown(self):
        """The scheduler could not be read: nobody can say what approving costs."""
        return bool(self.error)

    def as_record(self):
        """What the approver saw, for Repair.approval_view (JSON)."""
        return {"scheduler": self.scheduler, "error": self.error,
                "read_at": self.read_at.isoformat() if self.read_at else None,
                "jobs": [{"id": job.id, "user": job.user, "account": job.account,
                          "name": job.name, "gpus": job.gpus, "nodes": list(job.nodes),
                          "run_time_s": job.run_time_s,
                          "gpu_hours": None if job.gpu_hours is None
                          else round(job.gpu_hours, 2)} for job in self.jobs],
                "nodes_hit": self.nodes_hit}


HISTORY_DAYS = 90
GPU_HISTORY_LIMIT = 10  # of each: events, repairs


@dataclass(frozen=True)
class GpuHistory:
    """What happened to one GPU, followed by its serial (else its UUID) across nodes and the
    clusters the reader may see, in the last HISTORY_DAYS."""

    gpu: Gpu
    events: list  # HealthEvents, newest first (the repair's own events left out)
    repairs: list  # Repairs of it, newest first (the repair itself left out)

    @property
    def followed_by(self):
        return f"serial {self.gpu.serial}" if self.gpu.serial else f"UUID {self.gpu.uuid}"


@dataclass(frozen=True)
class RepairCard:
    repair: Repair
    jobs: JobsAtRisk | None = None  # asked for proposed repairs only
    history: list | None = None  # the node's earlier repairs, newest first; None: not shown
    blast_radius: BlastRadius | None = None  # proposed repairs that take the node out
    gpu_history: GpuHistory | None = None  # proposed repairs of one GPU
    node_signals: list | None = None  # [(signature, how many)] on the node, 90 days

    @property
    def action_explanation(self):
        return ACTION_EXPLANATIONS[self.repair.action]

    @property
    def snooze_choices(self):
        return CommentForm.SNOOZE_CHOICES

    @property
    def keeps_the_node_in_service(self):
        return self.repair.action in IN_SERVICE_ACTIONS

    @property
    def drain(self):
        """The repair's DrainPlan."""
        return plan_of(self.repair)

    @property
    def drain_choices(self):
        """[(mode, label, explanation)] the approver may choose from; one: no choice."""
        return [(mode, DrainMode(mode).label, DRAIN_MODE_EXPLANATIONS[mode])
                for mode in modes_for(self.repair.action)]

    @property
    def jobs_end_by(self):
        """When the jobs on the node reach their time limits (the latest), or None when one
        has none, or they are not known."""
        if self.jobs is None or not self.jobs.jobs or self.jobs.read_at is None:
            return None
        return jobs_end_by(self.jobs.jobs, self.jobs.read_at)

    def approval_record(self):
        """What this card shows an approver about the cost, for Repair.approval_view."""
        record = self.jobs.as_record() if self.jobs is not None else {}
        if self.blast_radius is not None:
            record["blast_radius"] = self.blast_radius.text
        elif self.keeps_the_node_in_service:
            record["blast_radius"] = "the node stays in service"
        return record


def jobs_cache_key(cluster, node):
    return f"repairs:jobs-at-risk:{cluster.pk}:{node.pk}"


def jobs_at_risk(cluster, nodes, now=None):
    """{node id: JobsAtRisk}, each the scheduler's answer of at most JOBS_FRESH_FOR_S ago
    (the cache), so a live Repair tab does not run squeue at every redraw. A scheduler that
    did not answer for one node is not asked again for the next: each question would wait
    out its own time limit; its error is kept as long as an answer would be."""
    now = now or timezone.now()
    keys = {node.pk: jobs_cache_key(cluster, node) for node in nodes}
    cached = cache.get_many(list(keys.values()))
    found = {node.pk: cached[keys[node.pk]] for node in nodes if keys[node.pk] in cached}
    missing = [node for node in nodes if node.pk not in found]
    if not missing:
        return found
    asked = ask_scheduler(cluster, missing, now)
    cache.set_many({keys[node_id]: answer for node_id, answer in asked.items()},
                   timeout=JOBS_FRESH_FOR_S)
    return {**found, **asked}


def ask_scheduler(cluster, nodes, now):
    try:
        scheduler = scheduler_for(cluster)
    except ExecutorError as error:
        return {node.pk: JobsAtRisk(node.name, error=str(error), read_at=now) for node in nodes}
    if isinstance(scheduler, NoScheduler):
        return {node.pk: JobsAtRisk(node.name, read_at=now) for node in nodes}
    found, error = {}, ""
    for node in nodes:
        if not error:
            try:
                found[node.pk] = JobsAtRisk(node.name, tuple(scheduler.running_jobs(node.name)),
                                            scheduler.name, read_at=now)
                continue
            except ExecutorError as exc:
                error = str(exc)
        found[node.pk] = JobsAtRisk(node.name, scheduler=scheduler.name, error=error,
                                    read_at=now)
    return found


def proposed_jobs(repair):
    """The jobs a proposed repair would hit; None once it is past approval."""
    if repair.status != Status.PROPOSED:
        return None
    return jobs_at_risk(repair.cluster, [repair.node])[repair.node_id]


def node_histories(node_ids, exclude_ids, limit=NODE_HISTORY_LIMIT):
    """{node id: [its latest `limit` repairs, newest first]}, in one query."""
    if not node_ids:
        return {}
    newest_first = [F("requested_at").desc(), F("id").desc()]
    rows = (Repair.objects.filter(node_id__in=node_ids).exclude(pk__in=exclude_ids)
            .annotate(nth=Window(RowNumber(), partition_by=[F("node_id")], order_by=newest_first))
            .filter(nth__lte=limit).select_related("cluster").order_by("node_id", *newest_first))
    histories = {}
    for repair in rows:
        histories.setdefault(repair.node_id, []).append(repair)
    return histories


def repair_cards(repairs, user, now=None):
    """Cards for repairs fetched through with_card_data(); proposed ones bring what they
    cost (the jobs on their nodes, the blast radius after them) and what was tried (their
    nodes' earlier repairs and signals, their GPU's history where `user` may see it)."""
    now = now or timezone.now()
    repairs = list(repairs)
    proposed = [r for r in repairs if r.status == Status.PROPOSED]
    if not proposed:
        return [RepairCard(r) for r in repairs]
    cluster = proposed[0].cluster
    jobs = jobs_at_risk(cluster, [r.node for r in proposed], now)
    histories = node_histories([r.node_id for r in proposed], [r.pk for r in repairs])
    out = out_of_service(cluster)
    gpus = gpu_histories(proposed, clusters_for_user(user), now)
    signals = node_signals([r.node_id for r in proposed], now)
    return [RepairCard(r, jobs[r.node_id], histories.get(r.node_id, []),
                       None if r.action in IN_SERVICE_ACTIONS else out.after(r.node_id),
                       gpus.get(r.pk), signals.get(r.node_id, []))
            if r.status == Status.PROPOSED else RepairCard(r) for r in repairs]


def proposed_card(repair, user=None, history=None):
    """The card of one repair, with what a proposed one costs (and, for a reader `user`,
    what was tried)."""
    if repair.status != Status.PROPOSED:
        return RepairCard(repair, history=history)
    if user is None:  # what approving costs only (recorded with an approval)
        radius = None if repair.action in IN_SERVICE_ACTIONS \
            else out_of_service(repair.cluster).after(repair.node_id)
        return RepairCard(repair, proposed_jobs(repair), history, radius)
    card = repair_cards([repair], user)[0]
    return card if history is None else replace(card, history=history)


def gpu_histories(repairs, clusters, now):
    """{repair id: GpuHistory} for repairs of one GPU: the events and repairs of that GPU
    (by serial, else UUID) on any node of `clusters` in the last HISTORY_DAYS. A fixed
    number of queries for any number of repairs."""
    with_gpu = [r for r in repairs if r.gpu is not None]
    if not with_gpu:
        return {}
    serials = {r.gpu.serial for r in with_gpu if r.gpu.serial}
    uuids = {r.gpu.uuid for r in with_gpu if not r.gpu.serial}
    same = (Gpu.objects.filter(node__cluster__in=clusters)
            .filter(Q(serial__in=serials) | Q(uuid__in=uuids)).values_list("pk", "serial", "uuid"))
    rows_of = {}
    for pk, serial, uuid in same:
        rows_of.setdefault(serial or uuid, set()).add(pk)
    since = now - timedelta(days=HISTORY_DAYS)
    own_events = {e.pk for r in with_gpu for e in r.events.all()}
    all_rows = set().union(*rows_of.values()) if rows_of else set()
    events = list(HealthEvent.objects.filter(gpu_id__in=all_rows, first_seen__gte=since)
                  .exclude(pk__in=own_events).select_related("node__cluster", "gpu")
                  .order_by("-first_seen", "-id"))
    earlier = list(Repair.objects.filter(gpu_id__in=all_rows, requested_at__gte=since)
                   .exclude(pk__in=[r.pk for r in with_gpu]).select_related("node", "cluster")
                   .order_by("-requested_at", "-id"))
    histories = {}
    for repair in with_gpu:
        rows = rows_of.get(repair.gpu.serial or repair.gpu.uuid, {repair.gpu_id})
        histories[repair.pk] = GpuHistory(
            repair.gpu,
            [e for e in events if e.gpu_id in rows][:GPU_HISTORY_LIMIT],
            [r for r in earlier if r.gpu_id in rows][:GPU_HISTORY_LIMIT])
    return histories


def node_signals(node_ids, now):
    """{node id: [(signature, events)]}: what each node signalled in the last HISTORY_DAYS,
    most first, in one query (notices left out)."""
    rows = (HealthEvent.objects.filter(node_id__in=node_ids,
                                       first_seen__gte=now - timedelta(days=HISTORY_DAYS))
            .exclude(signature__in=NOTICES).values("node_id", "signature")
            .annotate(events=Count("id")).order_by("node_id", "-events", "signature"))
    signals = {}
    for row in rows:
        signals.setdefault(row["node_id"], []).append((row["signature"], row["events"]))
    return signals


def finished_repairs(cluster):
    return (Repair.objects.filter(cluster=cluster, status__in=FINISHED_STATUSES)
            .select_related("cluster", "node", "gpu", "requested_by", "reviewed_by")
            .order_by(F("finished_at").desc(nulls_last=True), "-requested_at", "-id"))


def node_repairs_context(node, user, now=None):
    """The context of templates/repairs/_node_repairs.html (node page: nodes.views)."""
    open_repair = with_card_data(node.repairs.open()).first()
    card = None if open_repair is None else proposed_card(open_repair, user)
    held_back_by = [] if open_repair else rejections_in_force(node, now or timezone.now())
    history = (node.repairs.filter(status__in=FINISHED_STATUSES)
               .select_related("cluster", "requested_by", "reviewed_by")
               [:NODE_PAGE_HISTORY_LIMIT])
    return {"node_repair": card, "node_repair_history": history, "held_back_by": held_back_by,
            "propose_form": ProposeRepairForm(), "xids": catalog()}


# The Repair settings page's policy table.


STATS_DAYS = 30
APPROVED = (Status.APPROVED, Status.WAITING, Status.RUNNING, Status.SUCCEEDED, Status.FAILED,
            Status.ABORTED)


@dataclass(frozen=True)
class Decisions:
    """How operators decided a signature's recommendations of the last STATS_DAYS: the
    evidence an admin reads before turning on auto-approve."""

    made: int = 0
    approved: int = 0  # by a person
    auto_approved: int = 0
    rejected: int = 0
    cancelled: int = 0
    resolved: int = 0  # its events closed before anyone acted
    superseded: int = 0
    pending: int = 0


def decisions_by_signature(cluster, now):
    """{signature: Decisions} of the system's recommendations on the cluster in the last
    STATS_DAYS, in one query."""
    rows = (Repair.objects.filter(cluster=cluster, requested_by__isnull=True,
                                  requested_at__gte=now - timedelta(days=STATS_DAYS))
            .values("signature", "status", "auto_approved").annotate(n=Count("id")))
    counts = {}
    for row in rows:
        tally = counts.setdefault(row["signature"], {f.name: 0 for f in fields(Decisions)})
        tally["made"] += row["n"]
        if row["status"] in APPROVED:
            tally["auto_approved" if row["auto_approved"] else "approved"] += row["n"]
        elif row["status"] == Status.PROPOSED:
            tally["pending"] += row["n"]
        else:
            tally[row["status"]] += row["n"]
    return {signature: Decisions(**tally) for signature, tally in counts.items()}


@dataclass(frozen=True)
class PolicyRow:
    signature: str
    default: Ladder
    override: RepairPolicy | None
    decisions: Decisions
    drain: DrainPlan  # how its repairs that take the node out drain on this cluster


def policy_drain(cluster, signature, ladder, override):
    """The DrainPlan of a signature's first rung on the cluster."""
    if override is not None and override.action:
        action = override.action
    else:
        action = next((a for a in ladder.actions if a not in IN_SERVICE_ACTIONS),
                      ladder.actions[0] if ladder.actions else Action.REBOOT)
    return plan_for(cluster, signature, action, policy=override)


def policy_rows(cluster, now=None):
    """The policy table: every signature of the catalog with a default ladder, the checks,
    the Xids with one for the cluster's GPU type, then the other signatures the cluster has
    a row for; each with its default ladder and why, so an admin sees what a row
    overrides, and how operators decided its recommendations of the last 30 days."""
    now = now or timezone.now()
    overrides = {p.signature: p for p in cluster.repair_policies.select_related("updated_by")}
    signatures = [*(name for name, info in SIGNATURES.items() if info.ladder),
                  *(f"check:{name}" for name in CHECKS),
                  *(f"xid:{code}" for code in sorted(catalog())
                    if policy_for(code, cluster.gpu_type).recommendation)]
    signatures += sorted(set(overrides) - set(signatures))
    decisions = decisions_by_signature(cluster, now)
    rows = []
    for signature in signatures:
        if "<" in signature:
            continue
        ladder = default_ladder(signature, cluster.gpu_type)
        override = overrides.get(signature)
        rows.append(PolicyRow(signature, ladder, override, decisions.get(signature, Decisions()),
                              policy_drain(cluster, signature, ladder, override)))
    return rows
