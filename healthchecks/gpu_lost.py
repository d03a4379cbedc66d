"""The inventory rule (DESIGN.md "Health"): a GPU of a node's inventory missing from its
latest hello opens `gpu_lost` (server-side); a new inventory (a replaced GPU) is accepted by
a repair's verify step or by an operator, which closes it. The comparison itself is
nodes/inventory.py's; the hello is stored by nodes.services.do_record_hello first.
"""

from datetime import datetime

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.db.models import F, Q
from django.http import HttpRequest
from django.utils import timezone

from clusters.services import actor_name, record_audit
from nodes.inventory import (
    GPU_LOST,
    MISSING_FROM_HELLO,
    InventoryDifference,
    InventoryReview,
    gpu_list,
    hello_problem,
    inventory_difference,
    inventory_gpu,
)
from nodes.models import Gpu, Node
from nodes.states import refresh_node_state

from .choices import Severity
from .models import HealthEvent
from .services import do_close_health_event, do_record_health_event


@transaction.atomic(savepoint=False)  # on every hello: no caller goes on after an error
def do_judge_inventory(node: Node, *, now: datetime | None = None) -> None:
    """After a hello: inventory GPUs absent from it are marked missing and get a gpu_lost,
    unless one is open on them (a repeated hello is not a new loss). One present again
    loses the mark; its gpu_lost stays open, an edge signal (DESIGN.md)."""
    now = now or timezone.now()
    node = Node.objects.get(pk=node.pk)
    hello = node.hello_gpus or []
    in_hello = {gpu["uuid"] for gpu in hello}
    inventory = list(node.gpus.in_inventory())
    missing = [gpu for gpu in inventory if gpu.uuid not in in_hello]
    found_again = [gpu.pk for gpu in inventory
                   if gpu.uuid in in_hello and gpu.missing_since is not None]
    if found_again:
        Gpu.objects.filter(pk__in=found_again).update(missing_since=None)
    Gpu.objects.filter(pk__in=[gpu.pk for gpu in missing if gpu.missing_since is None]).update(
        missing_since=now)
    lost_open = set(HealthEvent.objects.open().filter(signature=GPU_LOST, gpu__in=missing)
                    .values_list("gpu_id", flat=True))
    for gpu in missing:
        if gpu.pk in lost_open:
            continue
        do_record_health_event(
            node, signature=GPU_LOST, severity=Severity.CRITICAL, gpu=gpu,
            message=f"GPU {gpu.index} ({gpu.uuid}) is missing from the agent's hello",
            evidence={
                MISSING_FROM_HELLO: inventory_gpu(gpu),
                "hello_gpus": gpu_list(hello),
                "inventory_gpus": gpu_list(inventory),
                "boot_id": node.boot_id,
            },
            now=now,
        )


def review_gpu_inventory(node):
    """What accepting the node's latest hello as its inventory would change and close."""
    node = Node.objects.get(pk=node.pk)
    inventory = list(node.gpus.in_inventory())
    problem = hello_problem(node.hello_gpus)
    difference = InventoryDifference() if problem else inventory_difference(
        inventory, node.hello_gpus)
    # Closed: gpu_lost on the GPUs that leave, and those this rule opened on GPUs present
    # again; a gpu_lost the agent saw on a GPU still listed waits for a reboot's check.
    gpu_lost = HealthEvent.objects.open().filter(signature=GPU_LOST, gpu__isnull=False).filter(
        Q(gpu__in=difference.missing) | Q(evidence__has_key=MISSING_FROM_HELLO))
    return InventoryReview(difference, tuple(gpu_lost.filter(node=node).select_related("gpu")),
                           problem)


@transaction.atomic
def do_accept_gpu_inventory(node: Node, *, actor: AbstractBaseUser | None,
                            request: HttpRequest | None = None,
                            now: datetime | None = None) -> InventoryReview:
    """The node's inventory becomes the GPUs of its latest hello, and the gpu_lost events
    that settles close: an operator's decision, or a repair's verify step (actor None).
    Returns the InventoryReview it carried out; nothing changes unless it is acceptable."""
    now = now or timezone.now()
    node = Node.objects.select_for_update(no_key=True).get(pk=node.pk)
    review = review_gpu_inventory(node)
    if not review.acceptable:
        return review
    difference = review.difference
    Gpu.objects.filter(pk__in=[gpu.pk for gpu in difference.missing]).update(removed_at=now)
    # Indexes move one row at a time and two GPUs may swap theirs: the moving rows step out
    # of the way first (NVML indexes stay far below 1000).
    Gpu.objects.filter(pk__in=[gpu.pk for gpu, _ in difference.changed]).update(
        index=F("index") + 1000)
    for gpu, seen in difference.changed:
        Gpu.objects.filter(pk=gpu.pk).update(**seen)
    left = {gpu.uuid: gpu for gpu in node.gpus.filter(removed_at__isnull=False)}
    for seen in difference.waiting:
        if seen["uuid"] in left:
            Gpu.objects.filter(pk=left[seen["uuid"]].pk).update(**seen, removed_at=None)
        else:
            Gpu.objects.create(node=node, **seen)
    node.gpus.in_inventory().update(missing_since=None)
    for event in review.gpu_lost:
        do_close_health_event(event, reason=f"GPU inventory accepted by {actor_name(actor)}",
                              actor=actor, now=now)
    record_audit(actor, "node.accept_gpu_inventory", node, cluster=node.cluster,
                 changes={**difference.for_audit(),
                          "closed_events": [str(event.public_id) for event in review.gpu_lost]},
                 request=request, now=now)
    refresh_node_state(node, actor=actor, reason="GPU inventory accepted", now=now)
    return review
