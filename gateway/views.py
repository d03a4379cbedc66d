"""The gateway's one page: Prometheus's scrape of /metrics."""

import hmac
import time

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.http import HttpResponse
from django.views.decorators.http import require_GET

from .metrics import render_metrics


@login_not_required
@require_GET
def metrics(request):
    """Prometheus scrape endpoint; guarded by CLUSTERUI_METRICS_TOKEN (off when unset)."""
    expected = settings.CLUSTERUI_METRICS_TOKEN
    if not expected:
        return HttpResponse("metrics are off: set CLUSTERUI_METRICS_TOKEN\n", status=404,
                            content_type="text/plain")
    given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
    if not hmac.compare_digest(given.encode(), expected.encode()):
        return HttpResponse("bearer token required\n", status=401, content_type="text/plain",
                            headers={"WWW-Authenticate": "Bearer"})
    return HttpResponse(render_metrics(time.time()),
                        content_type="text/plain; version=0.0.4; charset=utf-8")
