from uuid import UUID

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpRequest, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from clusters.queries import get_cluster_for_user
from clusters.roles import Role, require_role
from nodes.queries import get_node_for_user, gpu_inventory_context
from nodes.responses import bulk_response, bulk_summary

from .gpu_lost import do_accept_gpu_inventory
from .xid_catalog import catalog
from .filters import CheckRunFilter, HealthEventFilter
from .forms import BulkCheckForm, ResolveForm, RunCheckForm, SilenceForm
from .models import CheckRun, HealthEvent
from .queries import EVENTS_WORST_FIRST, check_runs_context, open_events_by_signature
from .services import (
    do_acknowledge_event,
    do_bulk_request_checks,
    do_request_checks,
    do_resolve_event,
    do_silence_signature,
)

EVENTS_PAGE_SIZE = 50


def get_event_for_user(request: HttpRequest, slug: str, public_id: UUID) -> HealthEvent:
    cluster = get_cluster_for_user(request, slug)
    return get_object_or_404(HealthEvent.objects.select_related("node__cluster", "gpu"),
                             node__cluster=cluster, public_id=public_id)


@require_GET
@require_role(Role.VIEWER)
def event_list(request, slug):
    cluster = get_cluster_for_user(request, slug)
    events = HealthEvent.objects.filter(node__cluster=cluster).select_related(
        "node", "gpu", "acknowledged_by").prefetch_related("repairs").order_by(
        *EVENTS_WORST_FIRST)
    params = request.GET.copy()
    params.setdefault("open", "true")  # the tab opens on what is wrong now
    event_filter = HealthEventFilter(params, queryset=events)
    matching = event_filter.qs if event_filter.is_valid() else events.none()
    page = Paginator(matching, EVENTS_PAGE_SIZE).get_page(request.GET.get("page"))
    context = {"cluster": cluster, "tab": "health", "filter": event_filter, "page": page,
               "signature_counts": open_events_by_signature(cluster), "xids": catalog()}
    # htmx (filters, pages, live refresh): the table, and the counts out of band.
    return render(request, "healthchecks/_event_table_response.html" if request.htmx
                  else "healthchecks/list.html", context)


def _event_row_or_back(request, event):
    """After an action: htmx swaps the event's row; a plain form goes back to the tab."""
    if not request.htmx:
        return redirect("healthchecks:list", event.node.cluster.slug)
    event.refresh_from_db()
    return render(request, "healthchecks/_event_row_response.html",
                  {"e": event, "cluster": event.node.cluster, "xids": catalog()})


@require_POST
@require_role(Role.OPERATOR)
def event_acknowledge(request, slug, public_id):
    event = get_event_for_user(request, slug, public_id)
    if not do_acknowledge_event(event, actor=request.user, request=request):
        messages.info(request, "Already acknowledged or closed.")
    return _event_row_or_back(request, event)


@require_POST
@require_role(Role.OPERATOR)
def event_resolve(request, slug, public_id):
    event = get_event_for_user(request, slug, public_id)
    form = ResolveForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Say what was done: resolving needs a comment.")
    elif not do_resolve_event(event, actor=request.user, comment=form.cleaned_data["comment"],
                              request=request):
        messages.info(request, "It was already closed.")
    return _event_row_or_back(request, event)


@require_POST
@require_role(Role.OPERATOR)
def event_silence(request, slug, public_id):
    event = get_event_for_user(request, slug, public_id)
    form = SilenceForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Silencing needs a duration (0.25 to 336 hours) and a reason.")
    else:
        do_silence_signature(event.node, signature=event.signature,
                             hours=form.cleaned_data["hours"], reason=form.cleaned_data["reason"],
                             actor=request.user, request=request)
        messages.success(request, f"{event.signature} silenced on {event.node.name} for "
                                  f"{form.cleaned_data['hours']:g} h.")
    return _event_row_or_back(request, event)


@require_GET
@require_role(Role.VIEWER)
def check_runs(request, slug):
    cluster = get_cluster_for_user(request, slug)
    runs = CheckRun.objects.filter(node__cluster=cluster).select_related(
        "node", "requested_by", "health_event")
    run_filter = CheckRunFilter(request.GET, queryset=runs)
    matching = run_filter.qs if run_filter.is_valid() else runs.none()
    context = {**check_runs_context(cluster, matching, request.GET, request.GET.get("page")),
               "tab": "health", "filter": run_filter,
               "run_form": RunCheckForm(cluster=cluster,
                                        initial={"node": request.GET.get("node", "")})}
    return render(
        request, "healthchecks/runs.html" + ("#run-table" if request.htmx else ""), context)


@require_POST
@require_role(Role.OPERATOR)
def run_check(request, slug):
    cluster = get_cluster_for_user(request, slug)
    form = RunCheckForm(request.POST, cluster=cluster)
    if not form.is_valid():
        for errors in form.errors.values():
            messages.error(request, " ".join(errors))
        return redirect("healthchecks:runs", cluster.slug)
    node = form.cleaned_data["node"]
    names, purpose = form.checks_and_purpose()
    requested = do_request_checks(node, names, purpose=purpose, actor=request.user,
                                  request=request)
    started = [run.check_name for run, created in requested if created]
    running = [run.check_name for run, created in requested if not created]
    if started:
        messages.success(request, f"Started {', '.join(started)} on {node.name}.")
    if running:
        messages.info(request, f"Already running on {node.name}: {', '.join(running)}.")
    if not request.htmx:
        return redirect(f"{reverse('healthchecks:runs', args=[cluster.slug])}?node={node.name}")
    params = QueryDict(mutable=True)
    params["node"] = node.name
    context = check_runs_context(cluster, node.check_runs.select_related(
        "node", "requested_by", "health_event"), params, node=node)
    return render(request, "healthchecks/_check_runs.html", context)


@require_POST
@require_role(Role.OPERATOR)
def bulk_check(request, slug):
    cluster = get_cluster_for_user(request, slug)
    form = BulkCheckForm(request.POST, cluster=cluster)
    if form.is_valid():
        names, purpose = form.checks_and_purpose()
        started = do_bulk_request_checks(form.cleaned_data["nodes"], names, purpose=purpose,
                                         actor=request.user, request=request)
        messages.success(request, bulk_summary(f"started {form.cleaned_data['check']} on", started,
                                           "already running it"))
    return bulk_response(request, cluster, form)



@require_POST
@require_role(Role.OPERATOR)
def node_accept_gpu_inventory(request, slug, name):
    """The node's latest hello becomes its GPU inventory (DESIGN.md: gpu_lost)."""
    node = get_node_for_user(request, slug, name)
    review = do_accept_gpu_inventory(node, actor=request.user, request=request)
    if review.acceptable:
        closed = len(review.gpu_lost)
        messages.success(request, f"{node.name}: GPU inventory accepted"
                         + (f", {closed} gpu_lost closed." if closed else "."))
    else:
        messages.info(request, f"{node.name}: nothing to accept"
                      + (f" ({review.problem})." if review.problem else "."))
    if not request.htmx:
        return redirect(node)
    context = {"cluster": node.cluster, "node": node, "inventory_response": True,
               **gpu_inventory_context(node)}
    return render(request, "nodes/detail.html#gpu-inventory", context)

