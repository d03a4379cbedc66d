"""Cluster settings > Startup scripts: admins edit (validated on save), see versions and
diffs, and roll back; viewers read."""

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from clusters.queries import get_cluster_for_user
from clusters.roles import Role, has_role, require_role

from nodes.choices import NodeRole

from .forms import StartupScriptForm
from .models import ScriptEvent, StartupScript
from .services import (
    current_scripts,
    diff_lines,
    do_roll_back_startup_script,
    do_save_startup_script,
)


def _event_and_role(lifecycle, role):
    if lifecycle not in ScriptEvent.values or role not in NodeRole.values:
        raise Http404("No such event or role.")
    return ScriptEvent(lifecycle), NodeRole(role)


@require_GET
@require_role(Role.VIEWER)
def script_list(request, slug):
    cluster = get_cluster_for_user(request, slug)
    scripts = current_scripts(cluster)
    rows = [{"event": event, "cells": [(role, scripts.get((event.value, role.value)))
                                       for role in NodeRole]}
            for event in ScriptEvent]
    return render(request, "startup/list.html",
                  {"cluster": cluster, "tab": "settings", "rows": rows, "roles": list(NodeRole)})


@require_http_methods(["GET", "POST"])
@require_role(Role.VIEWER)
def script_edit(request, slug, lifecycle, role):
    cluster = get_cluster_for_user(request, slug)
    event, role = _event_and_role(lifecycle, role)
    if request.method == "POST" and not has_role(request.user, Role.ADMIN):
        raise PermissionDenied("Changing startup scripts needs the admin role.")
    script = StartupScript.objects.filter(cluster=cluster, event=event, role=role).select_related(
        "current_version").first()
    initial = {}
    if script is not None and script.current_version is not None:
        initial = {"body": script.current_version.body, "timeout_s": script.timeout_s}
    form = StartupScriptForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        version = do_save_startup_script(
            cluster, event=event, role=role, body=form.cleaned_data["body"],
            timeout_s=form.cleaned_data["timeout_s"], validation=form.validation,
            accepted_warnings=form.cleaned_data["accept_warnings"], actor=request.user,
            request=request)
        note = f" {form.validation.shellcheck_note}." if form.validation.shellcheck_missing else ""
        messages.success(request, f"Saved as version {version.number}; sent to connected "
                                  f"agents.{note}")
        return redirect("startup:edit", cluster.slug, event, role)
    return render(request, "startup/edit.html", {
        "cluster": cluster, "tab": "settings", "event": event, "role": role, "script": script,
        "form": form, "validation": form.validation}, status=400 if form.errors else 200)


@require_GET
@require_role(Role.VIEWER)
def script_versions(request, slug, lifecycle, role):
    """The versions, newest first; ?show=N shows version N and its diff from ?against=M
    (the version before N unless given)."""
    cluster = get_cluster_for_user(request, slug)
    event, role = _event_and_role(lifecycle, role)
    script = get_object_or_404(StartupScript, cluster=cluster, event=event, role=role)
    versions = list(script.versions.select_related("created_by"))
    by_number = {v.number: v for v in versions}
    shown = by_number.get(_int(request.GET.get("show"))) or (versions[0] if versions else None)
    against = None
    if shown is not None:
        against = by_number.get(_int(request.GET.get("against")))
        if against is None:
            against = next((v for v in versions if v.number < shown.number), None)
    return render(request, "startup/versions.html", {
        "cluster": cluster, "tab": "settings", "event": event, "role": role, "script": script,
        "versions": versions, "shown": shown, "against": against,
        "diff": diff_lines(against, shown) if shown and against else []})


def _int(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


@require_POST
@require_role(Role.ADMIN)
def script_roll_back(request, slug, lifecycle, role, number):
    cluster = get_cluster_for_user(request, slug)
    event, role = _event_and_role(lifecycle, role)
    script = get_object_or_404(StartupScript, cluster=cluster, event=event, role=role)
    get_object_or_404(script.versions, number=number)
    version = do_roll_back_startup_script(script, number, actor=request.user, request=request)
    messages.success(request, f"Rolled back: version {version.number} has version {number}'s "
                              f"body; sent to connected agents.")
    return redirect("startup:versions", cluster.slug, event, role)
