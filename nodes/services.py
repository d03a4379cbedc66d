"""Writes that change a node's facts. Each refreshes the node's state in its transaction."""

from django.db import transaction
from django.utils import timezone

from clusterui.services import record_audit

from .models import Gpu, Node
from .states import refresh_node_state


@transaction.atomic
def do_register_node(cluster, name, *, hostname="", actor=None, now=None):
    now = now or timezone.now()
    node = Node(cluster=cluster, name=name, hostname=hostname or name, joined_at=now)
    node.full_clean(exclude=["state"])
    node.save()
    refresh_node_state(node, actor=actor, reason="registered", now=now)
    node.refresh_from_db()
    return node


@transaction.atomic
def do_record_hello(node, *, boot_id, agent_version="", gpus=(), now=None):
    """A hello from the node's agent: it is connected; a new boot_id means it rebooted.

    `gpus` is the hello's list of {index, uuid, name, pci_bus_id, memory_total_bytes};
    GPUs not yet in the inventory are added (a GPU missing from it is the health rules').
    """
    now = now or timezone.now()
    node = Node.objects.select_for_update().get(pk=node.pk)
    rebooted = boot_id != node.boot_id
    Node.objects.filter(pk=node.pk).update(
        last_hello_at=now,
        last_seen=now,
        boot_id=boot_id,
        agent_version=agent_version,
        **({"booted_at": now} if rebooted else {}),
    )
    known = set(node.gpus.values_list("uuid", flat=True))
    Gpu.objects.bulk_create(
        [
            Gpu(
                node=node,
                index=gpu["index"],
                uuid=gpu["uuid"],
                name=gpu.get("name") or "",
                pci_bus_id=gpu.get("pci_bus_id") or "",
                memory_total_bytes=gpu.get("memory_total_bytes"),
            )
            for gpu in gpus
            if gpu["uuid"] not in known
        ]
    )
    refresh_node_state(node, reason="rebooted" if rebooted else "agent connected", now=now)
    node.refresh_from_db()
    return node


@transaction.atomic
def do_pause_node(node, *, actor, reason, request=None, now=None):
    now = now or timezone.now()
    updated = Node.objects.filter(pk=node.pk, paused=False).update(
        paused=True, paused_reason=f"paused by {actor.get_username()}: {reason}"[:255]
    )
    if updated:
        record_audit(actor, "node.pause", node, changes={"reason": reason},
                     cluster=node.cluster, request=request)
        refresh_node_state(node, actor=actor, now=now)
    node.refresh_from_db()
    return bool(updated)


@transaction.atomic
def do_resume_node(node, *, actor, request=None, now=None):
    now = now or timezone.now()
    updated = Node.objects.filter(pk=node.pk, paused=True).update(paused=False, paused_reason="")
    if updated:
        record_audit(actor, "node.resume", node, cluster=node.cluster, request=request)
        refresh_node_state(node, actor=actor, reason=f"resumed by {actor.get_username()}", now=now)
    node.refresh_from_db()
    return bool(updated)
