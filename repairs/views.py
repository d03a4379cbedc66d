"""The Repair tab, one repair's page, the node page's Repair section and the repair settings.

Every action calls one service of repairs.services; no view assigns a status. An htmx
action gets the repair's block back (and "repair-changed", so the page's other sections
follow); a plain form is sent back to where it came from.
"""


from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import trigger_client_event

from clusters.queries import get_cluster_for_user
from common.redirects import safe_next
from clusters.roles import Role, has_role, require_role
from common.exports import csv_response, invalid_filters_response
from healthchecks.xid_catalog import catalog
from nodes.queries import get_node_for_user

from .choices import OPEN_STATUSES, Action, AtDeadline, DrainMode, Status
from .providers import ACTIONS as PROVIDER_ACTIONS
from .filters import RepairHistoryFilter
from .forms import (
    AbortRepairForm,
    CommentForm,
    GoOnNowForm,
    ProposeRepairForm,
    RepairPolicyForm,
    RepairSettingsForm,
)
from .models import Repair
from .queries import (
    finished_repairs,
    get_repair_for_user,
    node_histories,
    node_repairs_context,
    policy_rows,
    proposed_card,
    repair_cards,
    with_card_data,
)
from .services import (
    RepairRefused,
    do_approve_repair,
    do_cancel_repair,
    do_propose_repair,
    do_recommend_again,
    do_reject_repair,
    do_set_repair_policy,
    do_update_repair_settings,
    settings_for,
)
from .steps import do_abort_repair, do_go_on_now
from .transitions import Conflict, InvalidTransition

HISTORY_PAGE_SIZE = 50


# The Repair tab.


def tab_context(request, cluster):
    open_repairs = with_card_data(Repair.objects.filter(cluster=cluster,
                                                        status__in=OPEN_STATUSES))
    history_filter = RepairHistoryFilter(request.GET, queryset=finished_repairs(cluster))
    matching = history_filter.qs if history_filter.is_valid() else Repair.objects.none()
    return {
        "cluster": cluster, "tab": "repair", "filter": history_filter,
        "awaiting": repair_cards(open_repairs.filter(status=Status.PROPOSED)
                                 .order_by("requested_at", "id"), request.user),
        "running": repair_cards(open_repairs.exclude(status=Status.PROPOSED)
                                .order_by("reviewed_at", "requested_at", "id"), request.user),
        "history": Paginator(matching, HISTORY_PAGE_SIZE).get_page(request.GET.get("page")),
        "xids": catalog(), "back_url": request.htmx.current_url_abs_path,
    }


@require_GET
@require_role(Role.VIEWER)
def repair_list(request, slug):
    cluster = get_cluster_for_user(request, slug)
    context = tab_context(request, cluster)
    # htmx (filters, pages, live refresh): the history, and the other two sections out of band.
    return render(request, "repairs/_sections_response.html" if request.htmx
                  else "repairs/list.html", context)


CSV_COLUMNS = ["repair", "id", "node", "gpu", "action", "signature", "status", "reason",
               "requested_at", "requested_by", "reviewed_at", "reviewed_by", "auto_approved",
               "review_comment", "started_at", "finished_at", "outcome"]


def csv_row(repair):
    def when(value):
        return value.isoformat() if value else ""

    return [repair.pk, repair.public_id, repair.node.name,
            repair.gpu.index if repair.gpu else "", repair.action, repair.signature,
            repair.status, repair.reason, when(repair.requested_at),
            repair.requested_by.get_username() if repair.requested_by else "system",
            when(repair.reviewed_at),
            repair.reviewed_by.get_username() if repair.reviewed_by else "",
            "yes" if repair.auto_approved else "no", repair.review_comment,
            when(repair.started_at), when(repair.finished_at), repair.outcome]


@require_GET
@require_role(Role.VIEWER)
def history_csv(request, slug):
    """The tab's history with its filters, every page, as CSV (times in UTC)."""
    cluster = get_cluster_for_user(request, slug)
    history_filter = RepairHistoryFilter(request.GET, queryset=finished_repairs(cluster))
    if not history_filter.is_valid():
        return invalid_filters_response(history_filter.errors)
    return csv_response(f"{cluster.slug}-repairs.csv", CSV_COLUMNS,
                        (csv_row(repair) for repair in history_filter.qs.iterator(chunk_size=500)))


# One repair.


@require_GET
@require_role(Role.VIEWER)
def repair_detail(request, slug, public_id):
    repair = get_repair_for_user(request, slug, public_id)
    history = node_histories([repair.node_id], [repair.pk]).get(repair.node_id, [])
    card = proposed_card(repair, request.user, history)
    context = {"cluster": repair.cluster, "tab": "repair", "card": card,
               "transitions": repair.transitions.all(), "xids": catalog(),
               "back_url": request.htmx.current_url_abs_path}
    return render(request, "repairs/detail.html" + ("#repair-detail" if request.htmx else ""),
                  context)


def already_message(repair, wanted):
    """What the second of two clicks finds: the repair as someone (or the system) left it."""
    repair = Repair.objects.select_related("reviewed_by").get(pk=repair.pk)
    status = repair.get_status_display()
    if wanted == Status.ABORTED:
        return f"Repair #{repair.pk} is {status} now: only a running repair can be aborted."
    if wanted == Status.CANCELLED and repair.status == Status.RUNNING:
        return (f"Repair #{repair.pk} is running: a running repair cannot be cancelled; "
                f"abort it instead (say why).")
    if repair.reviewed_at is not None:
        verdict = "rejected" if repair.status == Status.REJECTED else "approved"
        who = (repair.reviewed_by.get_username() if repair.reviewed_by
               else "the cluster's policy (auto-approve)" if repair.auto_approved else "someone")
        now = "" if repair.status in (Status.APPROVED, Status.REJECTED) else f"; it is {status} now"
        return f"Repair #{repair.pk} was already {verdict} by {who}{now}."
    last = repair.transitions.last()
    why = f" ({last.actor_name}: {last.reason})" if last else ""
    return f"Repair #{repair.pk} is already {status}{why}."


def done_message(repair, verb):
    if repair.status == Status.WAITING:
        return f"Repair #{repair.pk} {verb}; it waits: {repair.waiting_reason}."
    if repair.status == Status.RUNNING:
        return f"Repair #{repair.pk} {verb}; it is running."
    return f"Repair #{repair.pk} {verb}."


def form_errors(form):
    """A refused form's errors in one line, for the page's message."""
    return " ".join(error for errors in form.errors.values() for error in errors)


def act_on_repair(request, slug, public_id, service, wanted, verb):
    """approve, reject, cancel: one service each, with the optional comment; approving
    records what the card showed, rejecting or cancelling the snooze."""
    repair = get_repair_for_user(request, slug, public_id)
    form = CommentForm(request.POST)
    if not form.is_valid():
        messages.error(request, form_errors(form))
        return repair_response(request, slug, public_id)
    if wanted == Status.APPROVED:
        extra = {"seen": proposed_card(repair).approval_record(),
                 "confirmed_unknown_jobs": form.cleaned_data["confirm_unknown_jobs"],
                 "drain_mode": form.cleaned_data["drain_mode"] or None}
    else:
        extra = {"snooze": form.snooze_for()}
    try:
        moved = service(repair, actor=request.user, comment=form.cleaned_data["comment"],
                        request=request, **extra)
    except (Conflict, InvalidTransition):
        messages.warning(request, already_message(repair, wanted))
    except RepairRefused as refused:
        messages.error(request, f"Not {verb}: {refused}.")
    else:
        messages.success(request, done_message(moved, verb))
    return repair_response(request, slug, public_id)


def repair_response(request, slug, public_id):
    """After an action on a repair: htmx gets its block (and "repair-changed", so the page's
    other sections follow); a plain form goes back to where it came from."""
    repair = get_repair_for_user(request, slug, public_id)
    if not request.htmx:
        return redirect(safe_next(request, request.POST.get("next", ""),
                                  repair.get_absolute_url()))
    response = render(request, "repairs/_repair_response.html",
                      {"cluster": repair.cluster, "card": repair_cards([repair], request.user)[0],
                       "xids": catalog(), "back_url": request.htmx.current_url_abs_path})
    return trigger_client_event(response, "repair-changed")


@require_POST
@require_role(Role.OPERATOR)
def repair_approve(request, slug, public_id):
    return act_on_repair(request, slug, public_id, do_approve_repair, Status.APPROVED,
                         "approved")


@require_POST
@require_role(Role.OPERATOR)
def repair_reject(request, slug, public_id):
    return act_on_repair(request, slug, public_id, do_reject_repair, Status.REJECTED,
                         "rejected")


@require_POST
@require_role(Role.OPERATOR)
def repair_cancel(request, slug, public_id):
    return act_on_repair(request, slug, public_id, do_cancel_repair, Status.CANCELLED,
                         "cancelled")


@require_POST
@require_role(Role.OPERATOR)
def repair_abort(request, slug, public_id):
    """Stop a running repair, saying why; its node stays paused or resumes, as chosen."""
    repair = get_repair_for_user(request, slug, public_id)
    form = AbortRepairForm(request.POST)
    if not form.is_valid():
        messages.error(request, form_errors(form))
        return repair_response(request, slug, public_id)
    try:
        repair, node_text = do_abort_repair(
            repair, actor=request.user, comment=form.cleaned_data["comment"],
            resume_node=form.cleaned_data["node_after"] == "resume", request=request)
    except (Conflict, InvalidTransition):
        messages.warning(request, already_message(repair, Status.ABORTED))
    except RepairRefused as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Repair #{repair.pk} aborted. {node_text}")
    return repair_response(request, slug, public_id)


@require_POST
@require_role(Role.OPERATOR)
def repair_go_on_now(request, slug, public_id):
    """End a drain's wait for jobs, saying why: the jobs are stopped and the repair goes on."""
    repair = get_repair_for_user(request, slug, public_id)
    form = GoOnNowForm(request.POST)
    if not form.is_valid():
        messages.error(request, form_errors(form))
        return repair_response(request, slug, public_id)
    try:
        do_go_on_now(repair, actor=request.user, comment=form.cleaned_data["comment"],
                     request=request)
    except RepairRefused as exc:
        messages.error(request, f"Not now: {exc}.")
    else:
        messages.success(request, f"Repair #{repair.pk} goes on now: its jobs are stopped.")
    return repair_response(request, slug, public_id)


# The node page's Repair section.


@require_GET
@require_role(Role.VIEWER)
def node_repairs(request, slug, name):
    """The node page's Repair section alone: what static/js/repairs.js re-fetches. Opened
    directly (a bookmark, a link), it is the node's page, where the section is."""
    node = get_node_for_user(request, slug, name)
    if not request.htmx:
        return redirect("nodes:detail", node.cluster.slug, node.name)
    return render(request, "repairs/_node_repairs.html",
                  {"cluster": node.cluster, "node": node, **node_repairs_context(node, request.user),
                   "back_url": request.htmx.current_url_abs_path})


@require_POST
@require_role(Role.OPERATOR)
def repair_recommend_again(request, slug, name):
    """An operator asks for a recommendation again: the node's rejections stop holding it
    back."""
    node = get_node_for_user(request, slug, name)
    repair = do_recommend_again(node, actor=request.user, request=request)
    if repair is None:
        messages.info(request, f"Nothing on {node.name} calls for a repair now.")
    else:
        messages.success(request, f"Repair #{repair.pk} ({repair.action}) is recommended.")
    return node_repairs_response(request, node)


@require_POST
@require_role(Role.OPERATOR)
def repair_propose(request, slug, name):
    node = get_node_for_user(request, slug, name)
    form = ProposeRepairForm(request.POST)
    if not form.is_valid():
        messages.error(request, "A proposed repair needs an action and a reason.")
    else:
        try:
            repair = do_propose_repair(node, action=form.cleaned_data["action"],
                                       actor=request.user, reason=form.cleaned_data["reason"],
                                       request=request)
        except RepairRefused as refused:
            messages.error(request, f"Not proposed: {refused}.")
        else:
            messages.success(request, f"Repair #{repair.pk} ({repair.action}) proposed; it "
                                      f"waits for an operator's approval.")
    return node_repairs_response(request, node)


def node_repairs_response(request, node):
    """After an action in the node page's Repair section: htmx gets the section again; a
    plain form goes back to the node page."""
    if not request.htmx:
        return redirect("nodes:detail", node.cluster.slug, node.name)
    response = render(request, "repairs/_node_repairs_response.html",
                      {"cluster": node.cluster, "node": node, **node_repairs_context(node, request.user),
                       "back_url": request.htmx.current_url_abs_path})
    return trigger_client_event(response, "repair-changed")


# Settings: admins change them, everyone else reads them.


def settings_context(cluster, **forms):
    return {"cluster": cluster, "tab": "repair", "repair_settings": settings_for(cluster),
            "policy_rows": policy_rows(cluster), "actions": Action.choices,
            "drain_modes": [(value, label) for value, label in DrainMode.choices
                            if value != DrainMode.NO_DRAIN],
            "at_deadline_choices": AtDeadline.choices,
            "provider_actions": PROVIDER_ACTIONS, **forms}


@require_http_methods(["GET", "POST"])
@require_role(Role.VIEWER)
def repair_settings(request, slug):
    cluster = get_cluster_for_user(request, slug)
    if request.method == "POST" and not has_role(request.user, Role.ADMIN):
        raise PermissionDenied("Changing repair settings needs the admin role.")
    form = RepairSettingsForm(request.POST or None, instance=settings_for(cluster))
    if request.method == "POST" and form.is_valid():
        changed = do_update_repair_settings(form, actor=request.user, request=request)
        messages.success(request, f"Saved: {', '.join(changed)}." if changed
                         else "Nothing changed.")
        return redirect("repairs:settings", cluster.slug)
    status = 400 if request.method == "POST" else 200
    return render(request, "repairs/settings.html",
                  settings_context(cluster, form=form, policy_form=RepairPolicyForm()),
                  status=status)


@require_POST
@require_role(Role.ADMIN)
def repair_policy(request, slug):
    """One signature's row of the policy table."""
    cluster = get_cluster_for_user(request, slug)
    form = RepairPolicyForm(request.POST)
    if not form.is_valid():
        return render(request, "repairs/settings.html",
                      settings_context(cluster, form=RepairSettingsForm(
                          instance=settings_for(cluster)), policy_form=form), status=400)
    signature = form.cleaned_data["signature"]
    changed = do_set_repair_policy(cluster, signature, action=form.policy_action(),
                                   auto_approve=form.cleaned_data["auto_approve"],
                                   drain=form.drain_fields(), actor=request.user,
                                   request=request)
    messages.success(request, f"Policy for {signature} saved." if changed
                     else f"The policy for {signature} was already so.")
    return redirect("repairs:settings", cluster.slug)
