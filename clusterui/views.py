"""The project's own views: the home redirect and the load balancer's /healthz."""

import logging

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.db import connection
from django.http import JsonResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET

from clusters.models import Cluster
from clusters.roles import Role, require_role


@require_GET
@require_role(Role.VIEWER)
def home(request):
    clusters = list(Cluster.objects.only("slug")[:2])
    if len(clusters) == 1:
        return redirect("clusterui:overview", clusters[0].slug)
    return redirect("clusterui:cluster_list")

logger = logging.getLogger(__name__)


def database_answers():
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        return cursor.fetchone() == (1,)


def redis_answers():
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    try:
        return client.ping() is True
    finally:
        client.close()


def health_probes():
    """What /healthz asks: the database, and Redis where there is one (production)."""
    probes = {"database": database_answers}
    if settings.REDIS_URL:
        probes["redis"] = redis_answers
    return probes


@login_not_required
@require_GET
def healthz(request):
    """The load balancer's probe: 200 when every backing service answers, else 503 naming
    the ones that did not. Why they failed goes to the log only: it may name hosts or users."""
    failed = []
    for name, answers in health_probes().items():
        try:
            ok = answers()
        except Exception:
            logger.exception("healthz: %s does not answer", name)
            ok = False
        if not ok:
            failed.append(name)
    if failed:
        return JsonResponse({"status": "failing", "failed": failed}, status=503,
                            headers={"Cache-Control": "no-store"})
    return JsonResponse({"status": "ok"}, headers={"Cache-Control": "no-store"})
