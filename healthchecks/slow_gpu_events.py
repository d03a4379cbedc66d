"""The database side of the slow GPU rule (healthchecks/slow_gpus.py), for the live publisher.

Synchronous; the publisher calls them in a thread: one small read a tick (and the GPU models
once a minute), and writes only when the rule opens or closes something.
"""

from django.conf import settings

from nodes.models import Gpu

from .choices import Severity
from .models import HealthEvent
from .services import do_close_health_event, do_record_health_event
from .slow_gpus import SLOW_GPU, SlowGpuLimits

# The GPU models are read again this often: a GPU that just joined an inventory is compared
# with its peers from then on.
GPU_MODELS_REFRESH_S = 60.0


def slow_gpu_limits():
    return SlowGpuLimits(
        min_util_pct=settings.CLUSTERUI_SLOW_GPU_MIN_UTIL_PCT,
        clock_ratio=settings.CLUSTERUI_SLOW_GPU_CLOCK_RATIO,
        min_peers=settings.CLUSTERUI_SLOW_GPU_MIN_PEERS,
        hold_s=settings.CLUSTERUI_SLOW_GPU_HOLD_S,
        clear_s=settings.CLUSTERUI_SLOW_GPU_CLEAR_S,
    )


def read_slow_gpu_facts(with_models):
    """({(node id, GPU uuid)} of the open slow_gpu events, {GPU uuid: model} or None)."""
    open_keys = set(HealthEvent.objects.open().filter(signature=SLOW_GPU, gpu__isnull=False)
                    .values_list("node_id", "gpu__uuid"))
    models = dict(Gpu.objects.in_inventory().values_list("uuid", "name")) if with_models else None
    return open_keys, models


def record_slow_gpus(openings, closings, now):
    """Open and close slow_gpu events as the rule decided."""
    for opening in openings:
        gpu = (Gpu.objects.select_related("node")
               .filter(node_id=opening.node_id, uuid=opening.gpu_uuid).first())
        if gpu is not None:
            do_record_health_event(gpu.node, signature=SLOW_GPU, severity=Severity.WARNING,
                                   gpu=gpu, message=opening.message, evidence=opening.evidence,
                                   now=now)
    for closing in closings:
        events = HealthEvent.objects.open().filter(
            signature=SLOW_GPU, node_id=closing.node_id, gpu__uuid=closing.gpu_uuid)
        for event in events.select_related("node"):
            do_close_health_event(event, reason=closing.reason, now=now)
