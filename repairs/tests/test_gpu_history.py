"""What was tried, by GPU: a GPU's history follows its board serial across nodes and
clusters (the hello's `serial`), so a GPU moved to another node brings its past to the card."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from clusters.tests.factories import ClusterFactory
from healthchecks.services import do_close_health_event, do_record_health_event
from nodes.models import Gpu
from nodes.services import do_record_hello, do_register_node
from repairs.choices import Status
from repairs.services import refresh_recommendation
from repairs.tests.factories import RepairFactory

pytestmark = pytest.mark.django_db

SERIAL = "1654124008485"  # the real H200's (shared/fixtures/nvml/h200/nvidia-smi-q.xml)
UUID = "GPU-dd6e4c1f-0cd4-5c7e-a2b4-5e6f7a8b9c0d"


def hello(node, serial=SERIAL, uuid=UUID, boot_id="boot-1"):
    do_record_hello(node, boot_id=boot_id, gpus=[
        {"index": 3, "uuid": uuid, "name": "NVIDIA H200", "serial": serial,
         "pci_bus_id": "00000000:00:09.0", "memory_total_bytes": 150754820096}])
    return node.gpus.get(index=3)


def test_a_hello_records_each_gpus_serial_and_a_later_one_fills_it_in(cluster):
    node = do_register_node(cluster, "gpu-011")
    assert hello(node, serial=None).serial == ""  # none read: the UUID follows it
    assert hello(node).serial == SERIAL
    assert Gpu.objects.filter(node=node).count() == 1


def test_a_gpu_moved_to_another_node_brings_its_history_to_the_card(client_for, operator,
                                                                     cluster):
    now = timezone.now()
    other = ClusterFactory(name="prod-b200", slug="prod-b200")
    before = do_register_node(other, "gpu-011")
    old_gpu = hello(before)
    earlier = do_record_health_event(before, signature="xid:79", severity="critical",
                                     gpu=old_gpu, message="GPU has fallen off the bus",
                                     now=now - timedelta(days=30))
    do_close_health_event(earlier, reason="rebooted", now=now - timedelta(days=30))
    repaired = RepairFactory(node=before, gpu=old_gpu, action="reboot", signature="xid:79",
                             status=Status.SUCCEEDED, requested_at=now - timedelta(days=30))
    RepairFactory(node=before, gpu=old_gpu, action="reboot", signature="xid:79",
                  status=Status.SUCCEEDED, requested_at=now - timedelta(days=120))  # too old

    node = do_register_node(cluster, "gpu-024")
    gpu = hello(node)  # the same board, now in gpu-024
    do_record_health_event(node, signature="xid:79", severity="critical", gpu=gpu,
                           message="GPU has fallen off the bus", now=now)
    repair = refresh_recommendation(node, now=now)

    page = client_for(operator).get(reverse("repairs:list", args=[cluster.slug])).text
    card = page.split(f'id="repair-{repair.public_id}"')[1].split("</article>")[0]
    assert f"This GPU (<span class=\"mono\">serial {SERIAL}</span>), 90 days:" in card
    assert f"#{repaired.pk} reboot</a> of <span class=\"mono\">xid:79</span> on gpu-011 " \
           f"(prod-b200)" in card
    assert "on gpu-011 (prod-b200)" in card.split('class="gpu-history"')[1]
    assert "Earlier repairs of gpu-024: none, this is its first." in card
    assert card.split('class="gpu-history"')[1].split("</ul>")[0].count("<li>") == 2


def test_without_a_serial_the_uuid_follows_the_gpu(client_for, operator, cluster):
    node = do_register_node(cluster, "gpu-030")
    gpu = hello(node, serial=None)
    do_record_health_event(node, signature="xid:79", severity="critical", gpu=gpu,
                           message="GPU has fallen off the bus")
    refresh_recommendation(node)
    page = client_for(operator).get(reverse("repairs:list", args=[cluster.slug])).text
    assert f"This GPU (<span class=\"mono\">UUID {UUID}</span>), 90 days: nothing before " \
           f"this." in page
