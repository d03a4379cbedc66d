"""The gateway's one page: Prometheus's scrape of /metrics."""

import hmac
import time

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.http import HttpResponse
from django.views.decorators.http import require_GET

from .metrics import render_metrics
from .series import render_gateway_series

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


@login_not_required
@require_GET
def metrics(request):
    """Prometheus scrape endpoint: the GPU and console series, and this process's agent
    socket's own (in embedded mode, every agent's)."""
    refusal = scrape_refusal(request.headers.get("Authorization"))
    if refusal is not None:
        status, text, headers = refusal
        return HttpResponse(text, status=status, content_type="text/plain", headers=headers)
    return HttpResponse(render_metrics(time.time()) + render_gateway_series(),
                        content_type=CONTENT_TYPE)
