"""Alerts from the change feed: the notifier's reader (DESIGN.md "Data flow").

Once per tick update_alerts() reads the changes it has not seen and, for each repair,
health event, check run, script run and node-state change among them, opens or resolves
the alert that thing calls for. It looks at the object as it is now, not at what the change
said, so reading a change twice, or late, comes to the same alerts. The feed's cursor moves
in the same transaction as the alerts, so a failure hands the same changes out again.

Time alone makes a repair stuck: sweep_stuck_repairs() looks every tick at the repairs
that have made no progress for CLUSTERUI_NOTIFY_REPAIR_STUCK_S.
"""

from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Exists, Max, OuterRef
from django.urls import reverse
from django.utils import timezone

from clusters.change_feed import Kind, read_changes
from clusters.models import Cluster
from healthchecks.models import CheckRun, HealthEvent
from nodes.models import Node
from nodes.states import out_of_service
from repairs.choices import Status, StepKind, StepStatus
from repairs.models import Repair, RepairStep
from startup.models import ScriptRun

from .choices import ONE_OFF_KINDS, AlertKind
from .models import Alert, Delivery

NOTIFIER = "notifier"
ACTIVE_REPAIR = (Status.APPROVED, Status.WAITING, Status.RUNNING)
FAILED_CHECK = (CheckRun.Status.FAILED, CheckRun.Status.ERROR, CheckRun.Status.TIMED_OUT)


def update_alerts(now=None):
    """The notifier, once per tick. Returns how many alerts opened or resolved."""
    now = now or timezone.now()
    with transaction.atomic():
        changes = read_changes(NOTIFIER)
        handlers = {Kind.REPAIR: _repair_changed, Kind.CHECK_RUN: _check_run_changed,
                    Kind.SCRIPT_RUN: _script_run_changed,
                    Kind.NODE_STATE: _cluster_states_changed, Kind.AGENT_ACCESS: _node_gone}
        seen, moved, event_changes = set(), 0, []
        for change in changes:
            key = (change.kind, change.cluster_id, change.node_id, change.object_id)
            if change.kind == Kind.NODE_STATE:
                key = (Kind.NODE_STATE, change.cluster_id)  # one look at the cluster a tick
            if key in seen:
                continue
            seen.add(key)
            if change.kind == Kind.HEALTH_EVENT:  # all of the tick's at once, below
                event_changes.append(change)
            elif change.kind in handlers:
                moved += handlers[change.kind](change, now)
        moved += _events_changed(event_changes, now)
    return moved + sweep_stuck_repairs(now)


def open_alert(cluster_id, kind, key, *, summary, path, now, node=None, signature="",
               severity=""):
    """Open the alert unless one is firing for the key (or, for a one-off kind, unless it
    was ever opened). 1 when it opened, else 0."""
    alerts = Alert.objects.filter(cluster_id=cluster_id, kind=kind, key=key)
    if kind not in ONE_OFF_KINDS:
        alerts = alerts.firing()
    if alerts.exists():
        return 0
    try:
        with transaction.atomic():  # a concurrent sweep may open the same one
            new_alert(cluster_id, kind, key, summary=summary, path=path, now=now, node=node,
                      signature=signature, severity=severity).save(force_insert=True)
    except IntegrityError:
        return 0
    return 1


def new_alert(cluster_id, kind, key, *, summary, path, now, node=None, signature="",
              severity=""):
    """An Alert opening now, not saved (a one-off kind is resolved as it opens)."""
    return Alert(cluster_id=cluster_id, kind=kind, key=key, summary=summary[:300], path=path,
                 opened_at=now, resolved_at=now if kind in ONE_OFF_KINDS else None,
                 node_id=node.pk if node else None, node_name=node.name if node else "",
                 signature=signature, severity=severity)


def resolve_alert(cluster_id, kind, key, now):
    return Alert.objects.firing().filter(cluster_id=cluster_id, kind=kind, key=key).update(
        resolved_at=now)


def _object_id(change):
    return int(change.object_id) if change.object_id.isascii() and \
        change.object_id.isdigit() else None


def _repair_changed(change, now):
    key = f"repair:{change.object_id}"
    repair = Repair.objects.select_related("node", "cluster").filter(pk=_object_id(change)).first()
    if repair is None:  # gone with its node: nothing awaits anyone
        return sum(resolve_alert(change.cluster_id, kind, key, now) for kind in (
            AlertKind.REPAIR_AWAITING_APPROVAL, AlertKind.REPAIR_STUCK,
            AlertKind.REPAIR_PAST_DEADLINE))
    moved = 0
    path = repair.get_absolute_url()
    node = repair.node
    if repair.status == Status.PROPOSED:
        moved += open_alert(
            repair.cluster_id, AlertKind.REPAIR_AWAITING_APPROVAL, key, now=now, node=node,
            signature=repair.signature, path=path,
            summary=f"{node.name}: {repair.action} recommended for {repair.signature} "
                    f"(repair #{repair.pk}); approve or reject it")
    else:
        moved += resolve_alert(repair.cluster_id, AlertKind.REPAIR_AWAITING_APPROVAL, key, now)
    if repair.status not in ACTIVE_REPAIR:
        moved += resolve_alert(repair.cluster_id, AlertKind.REPAIR_STUCK, key, now)
    past = (repair.steps.filter(kind=StepKind.DRAIN, status=StepStatus.WAITING).first()
            if repair.status == Status.RUNNING else None)
    if past is not None and past.details.get("past_deadline"):
        jobs = ", ".join(job["id"] for job in past.details.get("jobs", []))
        moved += open_alert(
            repair.cluster_id, AlertKind.REPAIR_PAST_DEADLINE, key, now=now, node=node,
            signature=repair.signature, path=path,
            summary=f"{node.name}: repair #{repair.pk} ({repair.action}) still waits for "
                    f"jobs {jobs} past its drain deadline; go on now or abort it")
    else:
        moved += resolve_alert(repair.cluster_id, AlertKind.REPAIR_PAST_DEADLINE, key, now)
    if repair.status == Status.FAILED:
        moved += open_alert(
            repair.cluster_id, AlertKind.REPAIR_FAILED, key, now=now, node=node,
            signature=repair.signature, path=path,
            summary=f"{node.name}: repair #{repair.pk} ({repair.action}) failed: "
                    f"{repair.outcome or 'no reason recorded'}")
    return moved


def _events_changed(changes, now):
    """The alerts of the health events that opened or closed, in a few statements for the
    whole tick: one statement or three per event held the worker for seconds in an event
    storm, and the recommender's tick queued behind it (bench/README.md, "Event storm")."""
    if not changes:
        return 0
    events = HealthEvent.objects.select_related("node", "node__cluster", "gpu").in_bulk(
        [pk for pk in map(_object_id, changes) if pk is not None])
    to_resolve, to_open = {}, {}  # cluster id -> [alert key]; (cluster id, key) -> Alert
    for change in changes:
        key = f"event:{change.object_id}"
        event = events.get(_object_id(change))
        if event is None or event.closed_at is not None:
            cluster_id = change.cluster_id if event is None else event.node.cluster_id
            to_resolve.setdefault(cluster_id, []).append(key)
        else:
            to_open[(event.node.cluster_id, key)] = _event_alert(event, key, now)
    resolved = sum(Alert.objects.firing().filter(
        cluster_id=cluster_id, kind=AlertKind.NODE_UNHEALTHY, key__in=keys).update(
        resolved_at=now) for cluster_id, keys in to_resolve.items())
    firing = set(Alert.objects.firing().filter(
        kind=AlertKind.NODE_UNHEALTHY, key__in=[key for _, key in to_open]).values_list(
        "cluster_id", "key"))
    new = [alert for where, alert in to_open.items() if where not in firing]
    # A concurrent sweep may have opened one meanwhile: the constraint keeps it single.
    Alert.objects.bulk_create(new, ignore_conflicts=True)
    return resolved + len(new)


def _event_alert(event, key, now):
    node = event.node
    where = f" on GPU {event.gpu.index}" if event.gpu is not None else ""
    message = f": {event.message}" if event.message else ""
    return new_alert(
        node.cluster_id, AlertKind.NODE_UNHEALTHY, key, now=now, node=node,
        signature=event.signature, severity=event.severity, path=node.get_absolute_url(),
        summary=f"{node.name}: {event.signature} ({event.severity}){where}{message}")


def _check_run_changed(change, now):
    run = CheckRun.objects.select_related("node", "node__cluster").filter(
        pk=_object_id(change)).first()
    if run is None or run.purpose != CheckRun.Purpose.ACCEPTANCE or run.status not in FAILED_CHECK:
        return 0
    node = run.node
    return open_alert(
        node.cluster_id, AlertKind.ACCEPTANCE_FAILED, f"checkrun:{run.pk}", now=now, node=node,
        signature=run.check_name, path=node.get_absolute_url(),
        summary=f"{node.name}: acceptance test {run.check_name} {run.get_status_display()}"
                f"{': ' + run.message if run.message else ''}")


def _script_run_changed(change, now):
    run = ScriptRun.objects.select_related("node", "node__cluster", "script").filter(
        pk=_object_id(change)).first()
    if run is None or run.succeeded:
        return 0
    node = run.node
    how = "timed out" if run.timed_out else f"exited {run.exit_code}"
    job = f" (job {run.job_id})" if run.job_id else ""
    return open_alert(
        node.cluster_id, AlertKind.SCRIPT_FAILED, f"scriptrun:{run.pk}", now=now, node=node,
        signature=run.event, path=node.get_absolute_url(),
        summary=f"{node.name}: {run.get_event_display()} script version "
                f"{run.version_number} {how}{job}")


def _node_gone(change, now):
    """A node removed (its events and repairs went with it): its alerts resolve."""
    if change.node_id is None or Node.objects.filter(pk=change.node_id).exists():
        return 0  # only a token revoked
    return Alert.objects.firing().filter(cluster_id=change.cluster_id,
                                         node_id=change.node_id).update(resolved_at=now)


def _cluster_states_changed(change, now):
    cluster = Cluster.objects.filter(pk=change.cluster_id).first()
    if cluster is None:
        return 0
    out, total = out_of_service(cluster)
    if not cluster.is_degraded(out, total):
        return resolve_alert(cluster.pk, AlertKind.CLUSTER_DEGRADED, "cluster", now)
    return open_alert(
        cluster.pk, AlertKind.CLUSTER_DEGRADED, "cluster", now=now,
        path=reverse("clusterui:overview", args=[cluster.slug]),
        summary=f"{cluster.name} is degraded: {out} of {total} nodes are out of service "
                f"(paused or unhealthy), over its {cluster.degraded_threshold_pct} % threshold")


def sweep_stuck_repairs(now):
    """Open an alert for each approved, waiting or running repair with no progress (no
    move, no step started or finished) for CLUSTERUI_NOTIFY_REPAIR_STUCK_S; resolve it once
    the repair moves again."""
    cutoff = now - timedelta(seconds=settings.CLUSTERUI_NOTIFY_REPAIR_STUCK_S)
    # A drain waiting for jobs is not stuck: it waits up to its deadline, and past it the
    # repair has an alert of its own (_repair_changed).
    drain_waits = RepairStep.objects.filter(repair=OuterRef("pk"), kind=StepKind.DRAIN,
                                            status=StepStatus.WAITING)
    repairs = (Repair.objects.filter(status__in=ACTIVE_REPAIR).exclude(Exists(drain_waits))
               .annotate(moved_at=Max("transitions__at"), step_started=Max("steps__started_at"),
                         step_finished=Max("steps__finished_at"))
               .select_related("node", "cluster"))
    moved = 0
    for repair in repairs:
        progress = max(at for at in (repair.moved_at, repair.step_started, repair.step_finished,
                                     repair.requested_at) if at is not None)
        if progress > cutoff:  # moving (again)
            moved += resolve_alert(repair.cluster_id, AlertKind.REPAIR_STUCK,
                                   f"repair:{repair.pk}", now)
            continue
        waiting = f": {repair.waiting_reason}" if repair.waiting_reason else ""
        moved += open_alert(
            repair.cluster_id, AlertKind.REPAIR_STUCK, f"repair:{repair.pk}", now=now,
            node=repair.node, signature=repair.signature, path=repair.get_absolute_url(),
            summary=f"{repair.node.name}: repair #{repair.pk} ({repair.action}) has been "
                    f"{repair.get_status_display()} with no progress since "
                    f"{timezone.localtime(progress):%Y-%m-%d %H:%M}{waiting}")
    return moved


def prune(now=None):
    """Beat, hourly: resolved alerts and finished deliveries older than
    CLUSTERUI_NOTIFY_RETENTION_DAYS go (the delivery log keeps that long). Returns how many
    rows went."""
    now = now or timezone.now()
    cutoff = now - timedelta(days=settings.CLUSTERUI_NOTIFY_RETENTION_DAYS)
    alerts, _ = Alert.objects.filter(resolved_at__lt=cutoff).delete()
    deliveries, _ = Delivery.objects.filter(
        created_at__lt=cutoff, status__in=(Delivery.Status.SENT, Delivery.Status.FAILED)).delete()
    return alerts + deliveries
