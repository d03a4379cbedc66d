"""The gateway's one page: Prometheus's scrape of /metrics."""

import hmac
import time

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.http import HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

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
