"""The cluster's own pages: Kubernetes access, the secrets store and the audit trail."""

import json

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from common.exports import csv_response, invalid_filters_response

from . import kubeaccess
from .filters import AuditEntryFilter
from .forms import SecretForm
from .models import AuditEntry, Secret
from .queries import get_cluster_for_user
from .roles import Role, has_role, require_role
from .secret_store import SecretsUnavailable, do_delete_secret, do_set_secret


@require_http_methods(["GET", "POST"])
@require_role(Role.VIEWER)
def kubernetes_access(request, slug):
    """Every user's kubeconfig, the API server's OIDC flags and the role bindings for a
    Kubernetes cluster; admins edit the settings they come from."""
    cluster = get_cluster_for_user(request, slug)
    if request.method == "POST" and not has_role(request.user, Role.ADMIN):
        raise PermissionDenied("Changing Kubernetes access needs the admin role.")
    if not kubeaccess.is_kubernetes(cluster):
        return render(request, "clusters/kubeaccess_not_kubernetes.html",
                      {"cluster": cluster, "tab": "settings"},
                      status=200 if request.method == "GET" else 400)
    access = kubeaccess.access_for(cluster)
    initial = {} if access.pk else kubeaccess.console_kubeconfig_cluster(cluster)
    form = kubeaccess.KubernetesAccessForm(request.POST or None, instance=access, initial=initial)
    if request.method == "POST" and form.is_valid():
        changed = kubeaccess.do_update_kubernetes_access(cluster, form, actor=request.user,
                                                         request=request)
        messages.success(request, f"Saved: {', '.join(changed)}." if changed
                         else "Nothing changed.")
        return redirect("clusterui:kubernetes_access", cluster.slug)
    saved = kubeaccess.access_for(cluster)
    context = kubeaccess.page_context(cluster, saved, kubeaccess.oidc_facts(saved), request.user)
    return render(request, "clusters/kubeaccess.html",
                  {**context, "form": form, "prefilled": sorted(initial)},
                  status=400 if form.errors else 200)

@require_GET
@require_role(Role.VIEWER)
def kubeconfig_download(request, slug):
    """The signed-in user's kubeconfig for the cluster, as a file."""
    cluster = get_cluster_for_user(request, slug)
    if not kubeaccess.is_kubernetes(cluster):
        raise Http404("Not a Kubernetes cluster.")
    access = kubeaccess.access_for(cluster)
    config = kubeaccess.kubeconfig(access, kubeaccess.oidc_facts(access), request.user)
    if config is None:
        raise Http404("No kubeconfig yet: the API server URL or the OIDC settings are missing.")
    response = HttpResponse(kubeaccess.to_yaml(config), content_type="application/yaml")
    response["Content-Disposition"] = f'attachment; filename="kubeconfig-{cluster.slug}.yaml"'
    return response


AUDIT_PAGE_SIZE = 50
AUDIT_CSV_COLUMNS = ["time", "person", "action", "object_type", "object_id", "object",
                     "cluster", "source_ip", "changes"]


def audit_filter_for(request):
    return AuditEntryFilter(request.GET, queryset=AuditEntry.objects.select_related("cluster"))


@require_http_methods(["GET", "POST"])
@require_role(Role.ADMIN)
def secrets_page(request):
    """The secrets store: names, what each is for, who set it when; never a value. A POST sets
    one (a new name) or replaces its value."""
    form = SecretForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            secret, created = do_set_secret(
                form.cleaned_data["name"], form.cleaned_data["value"], actor=request.user,
                description=form.cleaned_data["description"], request=request)
        except SecretsUnavailable as exc:
            messages.error(request, str(exc))
        else:
            messages.success(request, f"Secret {secret.name} {'saved' if created else 'replaced'}.")
            return redirect("clusterui:secrets")
    return render(request, "clusters/secrets.html", {"form": form,
                                                      "secrets": Secret.objects.all()},
                  status=400 if request.method == "POST" else 200)


@require_POST
@require_role(Role.ADMIN)
def secret_delete(request, secret):
    secret = get_object_or_404(Secret, name=secret)
    do_delete_secret(secret, actor=request.user, request=request)
    messages.success(request, f"Secret {secret.name} deleted.")
    return redirect("clusterui:secrets")


@require_GET
@require_role(Role.ADMIN)
def audit_list(request):
    """The audit trail, newest first: who changed what, when and from where."""
    audit_filter = audit_filter_for(request)
    matching = audit_filter.qs if audit_filter.is_valid() else AuditEntry.objects.none()
    page = Paginator(matching, AUDIT_PAGE_SIZE).get_page(request.GET.get("page"))
    rows = [(entry, change_lines(entry.changes)) for entry in page]
    context = {"filter": audit_filter, "page": page, "rows": rows}
    return render(request, "clusters/audit.html" + ("#audit-table" if request.htmx else ""),
                  context)


def change_lines(changes):
    """An entry's changes as short lines: "region: us-west-2 → eu-north-1" for a changed
    field, "reason: disk swap" for anything else."""
    def text(value):
        return value if isinstance(value, str) else json.dumps(value, sort_keys=True)

    lines = []
    for key, value in changes.items():
        if isinstance(value, dict) and value.keys() == {"before", "after"}:
            lines.append(f"{key}: {text(value['before'])} → {text(value['after'])}")
        else:
            lines.append(f"{key}: {text(value)}")
    return lines


def audit_csv_row(entry):
    return [entry.at.isoformat(), entry.actor_name, entry.action,
            entry.object_type, entry.object_id, entry.object_repr,
            entry.cluster.slug if entry.cluster else "", entry.source_ip or "",
            json.dumps(entry.changes, sort_keys=True) if entry.changes else ""]


@require_GET
@require_role(Role.ADMIN)
def audit_csv(request):
    """The audit trail with the page's filters, every page, as CSV (times in UTC)."""
    audit_filter = audit_filter_for(request)
    if not audit_filter.is_valid():
        return invalid_filters_response(audit_filter.errors)
    return csv_response("audit.csv", AUDIT_CSV_COLUMNS,
                        (audit_csv_row(entry) for entry in audit_filter.qs.iterator(chunk_size=500)))
