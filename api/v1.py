"""The JSON API, /api/v1/ (django-ninja; the OpenAPI schema is at /api/v1/openapi.json).

A request carries a per-user API token (`Authorization: Bearer cui_...`, made on the API
tokens page) and acts as its user, with the user's role: the same services as the pages do
the work and write the same audit rows. A write the role does not allow is answered 403
and is on the audit trail too. Lists take the same filters as the pages, and `limit` and
`offset`: a page of at most `limit` items (100, at most 1000) from `offset`, with `count`
and the `next_offset` (null on the last page); a query parameter a list does not take is
answered 400. Errors are RFC 9457 problem details. Each token has a rate limit
(CLUSTERUI_API_RATE_PER_MIN).
"""

import json
import math
from uuid import UUID

from django.conf import settings
from django.db.models import Count, Q
from django.http import FileResponse, Http404, HttpResponse
from django.shortcuts import get_object_or_404
from django.urls import Resolver404, resolve, reverse
from ninja import NinjaAPI, Query, Router, Status
from ninja.errors import AuthenticationError, HttpError, Throttled, ValidationError
from ninja.security import HttpBearer
from ninja.throttling import AuthRateThrottle

from clusters.models import AuditEntry, Cluster
from clusters.roles import Role, has_role
from clusters.services import record_audit
from healthchecks.filters import CheckRunFilter, HealthEventFilter
from healthchecks.forms import RunCheckForm, SilenceForm
from healthchecks.models import CheckRun, HealthEvent
from healthchecks.queries import worst_open_signals
from healthchecks.services import do_acknowledge_event, do_request_checks, do_silence_signature
from jobs.models import Job
from nodes.choices import NodeState
from nodes.filters import NodeFilter
from nodes.live_store import get_live_store
from nodes.bundles import do_download_bundle, do_request_bundle, settle
from nodes.models import AgentCommand, DiagnosticBundle, Node
from nodes.queries import live_numbers
from nodes.services import do_pause_node, do_resume_node, do_send_command
from repairs.choices import Action, StepKind
from repairs.filters import RepairFilter
from repairs.forms import CommentForm
from repairs.models import Repair
from repairs.queries import proposed_card
from repairs.services import (
    RepairRefused,
    do_approve_repair,
    do_cancel_repair,
    do_propose_repair,
    do_recommend_again,
    do_reject_repair,
)
from repairs.drain_modes import plan_of
from repairs.steps import do_abort_repair, do_go_on_now
from repairs.transitions import Conflict, InvalidTransition

from . import schemas
from .lists import filtered, page_of, query_of
from .tokens import find_usable_token

PROBLEM = "application/problem+json"


class Forbidden(Exception):
    pass


class TokenAuth(HttpBearer):
    def authenticate(self, request, token):
        api_token = find_usable_token(token)
        if api_token is None or not has_role(api_token.user, Role.VIEWER):
            return None  # a user with no role any more reads nothing either
        request.user = api_token.user
        return api_token


api = NinjaAPI(
    title="clusterui", version="1", urls_namespace="api",
    description=__doc__, auth=TokenAuth(), docs_url="/docs",
    throttle=[AuthRateThrottle(f"{settings.CLUSTERUI_API_RATE_PER_MIN}/min")],
)


def problem(status, title, detail="", **extra):
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail, **extra}
    return HttpResponse(json.dumps(body), status=status, content_type=PROBLEM)


@api.exception_handler(AuthenticationError)
def unauthenticated(request, exc):
    response = problem(401, "Unauthorized", "Send a usable API token: Authorization: Bearer "
                                            "cui_... (made on the console's API tokens page).")
    response["WWW-Authenticate"] = "Bearer"
    return response


@api.exception_handler(Forbidden)
def forbidden(request, exc):
    return problem(403, "Forbidden", str(exc))


@api.exception_handler(Throttled)
def throttled(request, exc):
    response = problem(429, "Too Many Requests",
                       f"This token's limit is {settings.CLUSTERUI_API_RATE_PER_MIN} requests "
                       f"a minute; try again in {math.ceil(exc.wait or 1)} s.")
    response["Retry-After"] = str(math.ceil(exc.wait or 1))
    return response


@api.exception_handler(ValidationError)
def invalid(request, exc):
    return problem(422, "Unprocessable Content", "The request's fields are not valid.",
                   errors=json.loads(json.dumps(exc.errors, default=str)))


@api.exception_handler(Http404)
def not_found(request, exc):
    return problem(404, "Not Found", str(exc) or "No such object.")


def unknown_path(request):
    """Any other path under /api/v1/: 404 as problem+json, naming the one that exists when
    only its trailing slash is missing (the API's paths all end in one)."""
    detail = f"No API path {request.path}. The API's paths are listed at /api/v1/docs."
    if not request.path.endswith("/"):
        try:
            with_slash = resolve(request.path + "/")
        except Resolver404:
            with_slash = None
        if with_slash is not None and with_slash.view_name != "api:unknown":
            detail = f"No API path {request.path}: did you mean {request.path}/?"
    return problem(404, "Not Found", detail)


@api.exception_handler(HttpError)
def http_error(request, exc):
    return problem(exc.status_code, exc.message, str(exc.message))


@api.exception_handler(RepairRefused)
def refused(request, exc):
    return problem(409, "Conflict", str(exc))


@api.exception_handler(Conflict)
def conflict(request, exc):
    return problem(409, "Conflict", str(exc))


@api.exception_handler(InvalidTransition)
def invalid_transition(request, exc):
    return problem(409, "Conflict", str(exc))


def require(request, role):
    """Raise Forbidden (audited: who tried what) unless the token's user has `role`."""
    if has_role(request.user, role):
        return
    record_audit(request.user, "api.forbidden", request.auth, request=request,
                 changes={"method": request.method, "path": request.path,
                          "needs": role.label})
    raise Forbidden(f"{request.method} {request.path} needs the {role.label} role.")


def bad_request(form):
    detail = "; ".join(f"{field}: {' '.join(errors)}" for field, errors in form.errors.items())
    raise HttpError(400, detail)


# Each filtered list's query parameters: its FilterSet's filters, limit and offset.
NodeQuery = query_of(NodeFilter)
EventQuery = query_of(HealthEventFilter)
CheckRunQuery = query_of(CheckRunFilter)
RepairQuery = query_of(RepairFilter)


def cluster_of(slug):
    return get_object_or_404(Cluster, slug=slug)


# Reads -------------------------------------------------------------------------------------

clusters = Router(tags=["clusters"])


def cluster_json(cluster):
    by_state = dict(Node.objects.filter(cluster=cluster).values_list("state")
                    .annotate(n=Count("pk")))
    return {**{field: getattr(cluster, field) for field in (
        "slug", "name", "region", "gpu_type", "gpus_per_node", "scheduler", "status",
        "status_reason", "degraded_threshold_pct")}, "nodes": sum(by_state.values()), "nodes_by_state": by_state}


@clusters.get("/", response=schemas.ClusterPage, summary="The clusters")
def list_clusters(request, query: Query[schemas.Paging]):
    return page_of(Cluster.objects.order_by("name"), request, query, cluster_json)


@clusters.get("/{slug}/", response=schemas.ClusterOut, summary="One cluster")
def get_cluster(request, slug: str):
    return cluster_json(cluster_of(slug))


def node_json(node, live=None, signals=None, hygiene=None):
    return {"name": node.name, "hostname": node.hostname, "state": node.state,
            "role": node.role, "paused": node.state == NodeState.PAUSED,
            "paused_by_operator": node.paused, "gpus": node.gpu_count,
            "boot_id": node.boot_id, "agent_version": node.agent_version,
            "last_seen": node.last_seen,
            "worst_signal": (signals or {}).get(node.pk, ""),
            "live": (live or {}).get(node.pk), "hygiene": hygiene}


def nodes_of(cluster):
    return Node.objects.filter(cluster=cluster).annotate(
        gpu_count=Count("gpus", filter=Q(gpus__removed_at__isnull=True))).order_by("name")


@clusters.get("/{slug}/nodes/", response=schemas.NodePage,
              summary="Nodes, with their live numbers")
def list_nodes(request, slug: str, query: Query[NodeQuery]):
    cluster = cluster_of(slug)
    matching = filtered(NodeFilter, query, nodes_of(cluster))
    live, signals = live_numbers(cluster), worst_open_signals(cluster)
    return page_of(matching, request, query, lambda node: node_json(node, live, signals))


def node_of(cluster, name):
    return get_object_or_404(nodes_of(cluster), name=name)


@clusters.get("/{slug}/nodes/{name}/", response=schemas.NodeOut, summary="One node")
def get_node(request, slug: str, name: str):
    cluster = cluster_of(slug)
    node = node_of(cluster, name)
    entry = get_live_store().read_node(cluster.pk, node.pk) or {}
    return node_json(node, live_numbers(cluster), worst_open_signals(cluster, [node.pk]),
                     hygiene=entry.get("hygiene"))


def event_json(event):
    return {"public_id": event.public_id, "node": event.node.name,
            "gpu": event.gpu.index if event.gpu else None, "signature": event.signature,
            "severity": event.severity, "source": event.source, "message": event.message,
            "count": event.count, "first_seen": event.first_seen, "last_seen": event.last_seen,
            "closed_at": event.closed_at, "closed_reason": event.closed_reason,
            "acknowledged_at": event.acknowledged_at, "in_maintenance": event.in_maintenance}


@clusters.get("/{slug}/events/", response=schemas.EventPage,
              summary="Health events, the last seen first")
def list_events(request, slug: str, query: Query[EventQuery]):
    events = (HealthEvent.objects.filter(node__cluster=cluster_of(slug))
              .select_related("node", "gpu").order_by("-last_seen", "-id"))
    return page_of(filtered(HealthEventFilter, query, events), request, query, event_json)


def run_json(run):
    return {"public_id": run.public_id, "node": run.node.name, "check": run.check_name,
            "purpose": run.purpose, "status": run.status, "message": run.message,
            "metrics": run.metrics, "requested_at": run.requested_at,
            "finished_at": run.finished_at}


@clusters.get("/{slug}/checks/", response=schemas.CheckRunPage,
              summary="Check runs, newest first")
def list_check_runs(request, slug: str, query: Query[CheckRunQuery]):
    runs = (CheckRun.objects.filter(node__cluster=cluster_of(slug)).select_related("node")
            .order_by("-requested_at", "-id"))
    return page_of(filtered(CheckRunFilter, query, runs), request, query, run_json)


def repair_json(repair):
    return {"public_id": repair.public_id, "number": repair.pk, "node": repair.node.name,
            "action": repair.action, "status": repair.status, "signature": repair.signature,
            "reason": repair.reason, "requested_at": repair.requested_at,
            "reviewed_by": repair.reviewed_by.get_username() if repair.reviewed_by else None,
            "reviewed_at": repair.reviewed_at, "review_comment": repair.review_comment,
            "auto_approved": repair.auto_approved, "waiting_reason": repair.waiting_reason,
            "started_at": repair.started_at, "finished_at": repair.finished_at,
            "outcome": repair.outcome, "follows": repair.follows_id,
            "follows_why": repair.follows_why, "approval_view": repair.approval_view,
            "snooze_until": repair.snooze_until, "drain": drain_json(repair),
            "bundle": bundle_json(repair.bundle) if repair.bundle_id else None,
            "url": settings.CLUSTERUI_PUBLIC_URL.rstrip("/") + repair.get_absolute_url()}


def drain_json(repair):
    plan = plan_of(repair)
    drain = next((step for step in repair.steps.all() if step.kind == StepKind.DRAIN), None)
    waiting = drain.waiting_for_jobs if drain is not None else []
    return {"mode": plan.mode, "plan": plan.words, "deadline_s": plan.deadline_s,
            "at_deadline": plan.at_deadline, "signal": plan.signal,
            "signal_all_steps": plan.signal_all_steps, "waiting_for_jobs": waiting,
            "deadline": drain.drain_deadline if waiting else None,
            "past_deadline": bool(waiting and drain.details.get("past_deadline")),
            "stopping": drain.details.get("stopping") or "" if waiting else ""}


def repairs_of(cluster):
    return (Repair.objects.filter(cluster=cluster)
            .select_related("node", "cluster", "reviewed_by", "bundle__node__cluster")
            .prefetch_related("steps").order_by("-requested_at", "-id"))


@clusters.get("/{slug}/repairs/", response=schemas.RepairPage,
              summary="Repairs, newest first")
def list_repairs(request, slug: str, query: Query[RepairQuery]):
    repairs = repairs_of(cluster_of(slug))
    return page_of(filtered(RepairFilter, query, repairs), request, query, repair_json)


def repair_of(slug, ref):
    """A repair by its number (12, as the pages show #12) or its id."""
    repairs = repairs_of(cluster_of(slug))
    if ref.isascii() and ref.isdigit():
        return get_object_or_404(repairs, pk=int(ref))
    try:
        return get_object_or_404(repairs, public_id=UUID(ref))
    except ValueError:
        raise Http404(f"No repair {ref}: give its number or its id.") from None


@clusters.get("/{slug}/repairs/{ref}/", response=schemas.RepairOut, summary="One repair")
def get_repair(request, slug: str, ref: str):
    return repair_json(repair_of(slug, ref))


def job_json(job):
    return {field: getattr(job, field) for field in schemas.JobOut.model_fields}


@clusters.get("/{slug}/jobs/", response=schemas.JobPage,
              summary="Jobs from Slurm's accounting, newest first")
def list_jobs(request, slug: str, query: Query[schemas.JobQuery]):
    jobs = Job.objects.filter(cluster=cluster_of(slug)).order_by("-start", "-id")
    if query.user:
        jobs = jobs.filter(user=query.user)
    if query.state:
        jobs = jobs.filter(state__iexact=query.state)
    if query.node:
        jobs = jobs.filter(job_nodes__node_name=query.node)  # as the Jobs page: one of its nodes
    return page_of(jobs.distinct(), request, query, job_json)


audit = Router(tags=["audit"])


@audit.get("/", response=schemas.AuditPage,
           summary="The audit trail, newest first (admins)")
def list_audit(request, query: Query[schemas.AuditQuery]):
    require(request, Role.ADMIN)
    entries = AuditEntry.objects.select_related("cluster").order_by("-at", "-id")
    if query.action:
        entries = entries.filter(action=query.action)
    if query.actor:
        entries = entries.filter(actor_name=query.actor)
    if query.cluster:
        entries = entries.filter(cluster__slug=query.cluster)
    return page_of(entries, request, query, lambda entry: {
        "at": entry.at, "actor": entry.actor_name, "action": entry.action,
        "object_type": entry.object_type, "object_id": entry.object_id,
        "object": entry.object_repr, "cluster": entry.cluster.slug if entry.cluster else None,
        "source_ip": entry.source_ip, "changes": entry.changes})


# Acts ---------------------------------------------------------------------------------------

def acted(repair):
    return repair_json(Repair.objects.select_related("node", "cluster", "reviewed_by",
                                                     "bundle__node__cluster")
                       .prefetch_related("steps").get(pk=repair.pk))


@clusters.post("/{slug}/repairs/{ref}/approve/", response=schemas.RepairOut,
               summary="Approve a proposed repair (operators)")
def approve_repair(request, slug: str, ref: str, body: schemas.Approval):
    require(request, Role.OPERATOR)
    repair = repair_of(slug, ref)
    return acted(do_approve_repair(repair, actor=request.user, comment=body.comment,
                                   seen=proposed_card(repair).approval_record(),
                                   confirmed_unknown_jobs=body.confirm_unknown_jobs,
                                   drain_mode=body.drain_mode, request=request))


def verdict_form(body):
    """A reject's or cancel's body, checked by the page's own form."""
    form = CommentForm({"comment": body.comment, "snooze": body.snooze})
    if not form.is_valid():
        bad_request(form)
    return form


@clusters.post("/{slug}/repairs/{ref}/reject/", response=schemas.RepairOut,
               summary="Reject a proposed repair (operators)")
def reject_repair(request, slug: str, ref: str, body: schemas.Verdict):
    require(request, Role.OPERATOR)
    repair = repair_of(slug, ref)
    form = verdict_form(body)
    return acted(do_reject_repair(repair, actor=request.user, comment=body.comment,
                                  snooze=form.snooze_for(), request=request))


@clusters.post("/{slug}/repairs/{ref}/cancel/", response=schemas.RepairOut,
               summary="Cancel an approved or waiting repair (operators)")
def cancel_repair(request, slug: str, ref: str, body: schemas.Verdict):
    require(request, Role.OPERATOR)
    repair = repair_of(slug, ref)
    form = verdict_form(body)
    return acted(do_cancel_repair(repair, actor=request.user, comment=body.comment,
                                  snooze=form.snooze_for(), request=request))


@clusters.post("/{slug}/repairs/{ref}/abort/", response=schemas.RepairOut,
               summary="Abort a running repair, saying why (operators)")
def abort_repair(request, slug: str, ref: str, body: schemas.Abort):
    require(request, Role.OPERATOR)
    repair = repair_of(slug, ref)
    repair, _ = do_abort_repair(repair, actor=request.user, comment=body.comment,
                                resume_node=body.resume_node, request=request)
    return acted(repair)


@clusters.post("/{slug}/repairs/{ref}/go-on-now/", response=schemas.RepairOut,
               summary="End a running repair's wait for jobs, saying why: they are stopped "
                       "now and the repair goes on (operators)")
def go_on_now(request, slug: str, ref: str, body: schemas.GoOnNow):
    require(request, Role.OPERATOR)
    return acted(do_go_on_now(repair_of(slug, ref), actor=request.user, comment=body.comment,
                              request=request))


@clusters.post("/{slug}/nodes/{name}/repairs/", response={201: schemas.RepairOut},
               summary="Propose a repair of a node (operators); it waits for approval")
def propose_repair(request, slug: str, name: str, body: schemas.Propose):
    require(request, Role.OPERATOR)
    if body.action not in Action.values:
        raise HttpError(400, f"action: one of {', '.join(Action.values)}")
    node = node_of(cluster_of(slug), name)
    repair = do_propose_repair(node, action=body.action, actor=request.user,
                               reason=body.reason, request=request)
    return Status(201, acted(repair))


@clusters.post("/{slug}/nodes/{name}/cleanup/", response={202: schemas.CommandOut},
               summary="Have the node's agent end the orphans of ended jobs and signal "
                       "zombies' parents (operators); its answer comes in the command")
def clean_up_node(request, slug: str, name: str):
    require(request, Role.OPERATOR)
    node = node_of(cluster_of(slug), name)
    command = do_send_command(node, AgentCommand.Action.CLEANUP, actor=request.user,
                              request=request)
    return Status(202, {"id": command.pk, "node": node.name, "action": command.action,
                        "status": command.status, "message": command.message,
                        "requested_at": command.requested_at,
                        "finished_at": command.finished_at})


def bundle_json(bundle):
    stored = bundle.status == DiagnosticBundle.Status.STORED
    return {"public_id": bundle.public_id, "node": bundle.node.name, "reason": bundle.reason,
            "status": bundle.status, "message": bundle.message,
            "requested_at": bundle.requested_at, "stored_at": bundle.stored_at,
            "size_bytes": bundle.size_bytes, "sha256": bundle.sha256, "files": bundle.listing,
            "download_url": reverse("api:download_bundle", args=[
                bundle.node.cluster.slug, bundle.node.name, bundle.public_id])
            if stored else None}


@clusters.get("/{slug}/nodes/{name}/bundles/", response=schemas.BundlePage,
              summary="The node's diagnostic bundles, newest first")
def list_bundles(request, slug: str, name: str, query: Query[schemas.Paging]):
    node = node_of(cluster_of(slug), name)
    bundles = node.bundles.select_related("node__cluster").order_by("-requested_at", "-id")
    return page_of(bundles, request, query, lambda bundle: bundle_json(settle(bundle)))


@clusters.post("/{slug}/nodes/{name}/bundles/", response={202: schemas.BundleOut},
               summary="Ask the node's agent for a diagnostic bundle (operators)")
def request_bundle(request, slug: str, name: str):
    require(request, Role.OPERATOR)
    node = node_of(cluster_of(slug), name)
    bundle = do_request_bundle(node, reason=f"asked by {request.user.get_username()}",
                               actor=request.user, request=request)
    return Status(202, bundle_json(bundle))


@clusters.get("/{slug}/nodes/{name}/bundles/{bundle_id}/", response={200: None},
              summary="Download a stored diagnostic bundle, a gzip-compressed tar file "
                      "(operators; audited)")
def download_bundle(request, slug: str, name: str, bundle_id: UUID):
    require(request, Role.OPERATOR)
    node = node_of(cluster_of(slug), name)
    bundle = get_object_or_404(node.bundles, public_id=bundle_id,
                               status=DiagnosticBundle.Status.STORED)
    return FileResponse(do_download_bundle(bundle, actor=request.user, request=request),
                        as_attachment=True, filename=bundle.filename,
                        content_type="application/gzip")


@clusters.post("/{slug}/nodes/{name}/recommend-again/", response={200: schemas.RepairOut,
                                                                  204: None},
               summary="Ask for a recommendation again: the node's rejected and cancelled "
                       "repairs stop holding it back (operators); 204 when nothing calls "
                       "for a repair")
def recommend_again(request, slug: str, name: str):
    require(request, Role.OPERATOR)
    node = node_of(cluster_of(slug), name)
    repair = do_recommend_again(node, actor=request.user, request=request)
    if repair is None:
        return Status(204, None)
    return Status(200, repair_json(Repair.objects.select_related("node", "cluster", "reviewed_by")
                                   .get(pk=repair.pk)))


@clusters.post("/{slug}/nodes/{name}/pause/", response=schemas.NodeOut,
               summary="Pause a node (operators)")
def pause_node(request, slug: str, name: str, body: schemas.Pause):
    require(request, Role.OPERATOR)
    cluster = cluster_of(slug)
    do_pause_node(node_of(cluster, name), actor=request.user, reason=body.reason,
                  request=request)
    return node_json(node_of(cluster, name))


@clusters.post("/{slug}/nodes/{name}/resume/", response=schemas.NodeOut,
               summary="Resume a paused node (operators)")
def resume_node(request, slug: str, name: str):
    require(request, Role.OPERATOR)
    cluster = cluster_of(slug)
    do_resume_node(node_of(cluster, name), actor=request.user, request=request)
    return node_json(node_of(cluster, name))


@clusters.post("/{slug}/nodes/{name}/checks/", response={201: list[schemas.CheckRunOut]},
               summary="Run a check on a node (operators); 'acceptance' runs the battery")
def run_check(request, slug: str, name: str, body: schemas.RunCheck):
    require(request, Role.OPERATOR)
    cluster = cluster_of(slug)
    node_of(cluster, name)
    form = RunCheckForm({"node": name, "check": body.check}, cluster=cluster)
    if not form.is_valid():
        bad_request(form)
    names, purpose = form.checks_and_purpose()
    requested = do_request_checks(form.cleaned_data["node"], names, purpose=purpose,
                                  actor=request.user, request=request)
    return Status(201, [run_json(run) for run, _ in requested])


def event_of(slug, public_id):
    return get_object_or_404(HealthEvent.objects.select_related("node", "node__cluster", "gpu"),
                             node__cluster=cluster_of(slug), public_id=public_id)


@clusters.post("/{slug}/events/{public_id}/acknowledge/", response=schemas.EventOut,
               summary="Acknowledge an open event (operators)")
def acknowledge_event(request, slug: str, public_id: UUID):
    require(request, Role.OPERATOR)
    event = event_of(slug, public_id)
    do_acknowledge_event(event, actor=request.user, request=request)
    return event_json(event_of(slug, public_id))


@clusters.post("/{slug}/events/{public_id}/silence/", response=schemas.EventOut,
               summary="Silence the event's signature on its node for a while (operators)")
def silence_event(request, slug: str, public_id: UUID, body: schemas.Silence):
    require(request, Role.OPERATOR)
    event = event_of(slug, public_id)
    form = SilenceForm({"hours": body.hours, "reason": body.reason})
    if not form.is_valid():
        bad_request(form)
    do_silence_signature(event.node, signature=event.signature,
                         hours=form.cleaned_data["hours"], reason=form.cleaned_data["reason"],
                         actor=request.user, request=request)
    return event_json(event_of(slug, public_id))


api.add_router("/clusters/", clusters)
api.add_router("/audit/", audit)
