"""The gateway's pages: Prometheus's scrape of /metrics, and the agent's wheelhouse."""

import hmac
import time

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.http import FileResponse, Http404, HttpResponse, JsonResponse
from django.utils.html import format_html, format_html_join
from django.views.decorators.http import require_GET

from nodes.wheelhouse import read_manifest, wheel_path

from .metrics import ALL_CLUSTERS, http_sd_targets, render_metrics

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def scrape_refusal(authorization):
    """(status, text, headers) when a scrape with this Authorization header is refused, else
    None: /metrics is guarded by CLUSTERUI_METRICS_TOKEN (off when unset). The web
    processes' /metrics and the agent gateway's (gateway/server.py) both ask it."""
    expected = settings.CLUSTERUI_METRICS_TOKEN
    if not expected:
        return 404, "metrics are off: set CLUSTERUI_METRICS_TOKEN\n", {}
    given = (authorization or "").removeprefix("Bearer ").strip()
    if not hmac.compare_digest(given.encode(), expected.encode()):
        return 401, "bearer token required\n", {"WWW-Authenticate": "Bearer"}
    return None


def refused(request):
    refusal = scrape_refusal(request.headers.get("Authorization"))
    if refusal is None:
        return None
    status, text, headers = refusal
    return HttpResponse(text, status=status, content_type="text/plain", headers=headers)


@login_not_required
@require_GET
def metrics(request):
    """Prometheus scrape endpoint: every cluster's GPU and console series and those of no
    cluster (this process's agent socket's too), or one cluster's (`?cluster=<slug>`), or
    only those of no cluster (`?cluster=`)."""
    refusal = refused(request)
    if refusal is not None:
        return refusal
    cluster = request.GET.get("cluster", ALL_CLUSTERS)
    return HttpResponse(render_metrics(time.time(), cluster), content_type=CONTENT_TYPE)


@login_not_required
@require_GET
def metrics_targets(request):
    """Prometheus' http_sd_configs: a target per cluster (deploy/prometheus/prometheus.yml)."""
    refusal = refused(request)
    if refusal is not None:
        return refusal
    return JsonResponse(http_sd_targets(request.get_host()), safe=False)


@login_not_required
@require_GET
def agent_wheels(request):
    """The agent's wheelhouse as pip's --find-links reads it: a page of links, each with its
    file's sha256 (nodes/wheelhouse.py). Open to nodes, which hold no session: it serves
    only what the console would publish anyway, and the install command pins every hash."""
    manifest = read_manifest()
    if manifest is None:
        return HttpResponse("no agent wheelhouse is built: run manage.py "
                            "build_agent_wheelhouse\n", status=404, content_type="text/plain")
    links = format_html_join("\n", '<a href="{}#sha256={}">{}</a><br>',
                             ((name, digest, name) for name, digest in manifest["files"].items()))
    return HttpResponse(format_html(
        "<!DOCTYPE html><html><head><title>clusterui-agent {}</title></head><body>\n{}\n"
        "</body></html>\n", manifest["agent_version"], links))


@login_not_required
@require_GET
def agent_wheel(request, name):
    """One wheel the wheelhouse's manifest lists; nothing else of the folder."""
    path = wheel_path(name)
    if path is None:
        raise Http404("no such wheel")
    return FileResponse(open(path, "rb"), content_type="application/octet-stream",
                        as_attachment=True, filename=name)
