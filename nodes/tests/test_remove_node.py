"""Removing a node never collides with the open-event constraints (issue 27): its GPUs, its
events and its repairs go with it in one delete, and a GPU that leaves the inventory keeps
its events (a GPU's history by serial depends on them)."""

import pytest
from django.db.models import RestrictedError
from django.utils import timezone

from healthchecks.models import HealthEvent
from healthchecks.services import do_record_health_event
from nodes.models import Gpu, Node
from nodes.services import do_remove_node
from nodes.tests.factories import GpuFactory, NodeFactory
from repairs.tests.factories import RepairFactory

pytestmark = pytest.mark.django_db


def node_with_two_open_xid13s(cluster):
    node = NodeFactory(cluster=cluster, name="gpu-013")
    gpus = [GpuFactory(node=node, index=index, uuid=f"GPU-13-{index}") for index in range(2)]
    for gpu in gpus:
        do_record_health_event(node, signature="xid:13", severity="warning", gpu=gpu,
                               message="Graphics Engine Exception")
    return node, gpus


def test_a_node_with_two_open_per_gpu_events_of_one_signature_can_be_removed(cluster, admin):
    node, _ = node_with_two_open_xid13s(cluster)
    RepairFactory(cluster=cluster, node=node, gpu=node.gpus.first(), status="rejected")
    assert do_remove_node(node, actor=admin, reason="decommissioned")
    assert not Node.objects.filter(pk=node.pk).exists()
    assert not Gpu.objects.filter(node_id=node.pk).exists()
    assert not HealthEvent.objects.filter(node_id=node.pk).exists()


def test_a_gpu_that_left_the_inventory_keeps_its_events(cluster):
    node, gpus = node_with_two_open_xid13s(cluster)
    Gpu.objects.filter(pk=gpus[0].pk).update(removed_at=timezone.now())
    assert HealthEvent.objects.filter(gpu=gpus[0], signature="xid:13").count() == 1
    # And a GPU's row is never deleted on its own while its events hold it.
    with pytest.raises(RestrictedError):
        gpus[0].delete()
    assert HealthEvent.objects.filter(gpu__isnull=False, node=node).count() == 2
