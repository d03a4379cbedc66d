"""gpu_lost from the inventory (server-side): a hello without a GPU of the node's inventory
opens it; accepting the latest hello as the inventory closes it (DESIGN.md)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from clusters.models import AuditEntry
from healthchecks.models import HealthEvent
from healthchecks.services import do_record_health_event
from nodes.choices import NodeState
from nodes.models import Gpu
from healthchecks.gpu_lost import do_accept_gpu_inventory, review_gpu_inventory
from healthchecks.tests.factories import say_hello
from nodes.services import do_register_node

pytestmark = pytest.mark.django_db

BOOT = "4f1c6d2e-0b1a-4c55-9e1e-6f3b2a1d0c9e"
REBOOT = "9a8b7c6d-0b1a-4c55-9e1e-6f3b2a1d0c9e"
H200_MEMORY = 150754820096  # nvml_snapshot.json


def hello_gpu(index, uuid):
    return {"index": index, "uuid": uuid, "name": "NVIDIA H200",
            "pci_bus_id": f"00000000:00:{6 + index:02X}.0", "memory_total_bytes": H200_MEMORY}


EIGHT = [hello_gpu(i, f"GPU-{i:04d}") for i in range(8)]


def without(gpus, uuid):
    return [gpu for gpu in gpus if gpu["uuid"] != uuid]


@pytest.fixture
def start():
    return timezone.now()


@pytest.fixture
def node(cluster, start):
    """A node whose agent said hello with its 8 GPUs, past its boot window."""
    node = do_register_node(cluster, "gpu-017", now=start)
    say_hello(node, boot_id=BOOT, gpus=EIGHT, now=start)
    return node


def later(start, minutes):
    return start + timedelta(minutes=minutes)


def inventory(node):
    return [(gpu.index, gpu.uuid) for gpu in node.gpus.in_inventory()]


def test_a_hello_without_a_gpu_of_the_inventory_opens_gpu_lost(node, start):
    node = say_hello(node, boot_id=BOOT, gpus=without(EIGHT, "GPU-0003"),
                           now=later(start, 5))

    event = HealthEvent.objects.open().get(node=node)
    assert (event.signature, event.severity, event.source) == ("gpu_lost", "critical", "passive")
    assert event.gpu == Gpu.objects.get(uuid="GPU-0003")
    assert event.message == "GPU 3 (GPU-0003) is missing from the agent's hello"
    assert event.evidence["missing_from_hello"]["uuid"] == "GPU-0003"
    assert len(event.evidence["inventory_gpus"]) == 8
    assert {"index": 3, "uuid": "GPU-0003"} not in event.evidence["hello_gpus"]
    assert len(event.evidence["hello_gpus"]) == 7
    assert node.state == NodeState.UNHEALTHY
    assert node.state_reason == "gpu_lost on GPU 3"
    assert Gpu.objects.get(uuid="GPU-0003").missing_since == later(start, 5)


def test_repeated_hellos_without_the_gpu_do_not_open_it_again(node, start):
    for minute in (5, 6, 7):
        say_hello(node, boot_id=BOOT, gpus=without(EIGHT, "GPU-0003"),
                        now=later(start, minute))

    event = HealthEvent.objects.get(node=node)
    assert (event.count, event.is_open) == (1, True)
    assert Gpu.objects.get(uuid="GPU-0003").missing_since == later(start, 5)


def test_a_gpu_back_in_a_hello_keeps_its_gpu_lost_open(node, start):
    say_hello(node, boot_id=BOOT, gpus=without(EIGHT, "GPU-0003"), now=later(start, 5))
    node = say_hello(node, boot_id=BOOT, gpus=EIGHT, now=later(start, 6))

    assert HealthEvent.objects.open().filter(node=node, signature="gpu_lost").count() == 1
    assert node.state == NodeState.UNHEALTHY  # an edge signal: accepted, not healed
    assert Gpu.objects.get(uuid="GPU-0003").missing_since is None


def test_a_replaced_gpu_waits_for_acceptance(node, start):
    replaced = without(EIGHT, "GPU-0003") + [hello_gpu(3, "GPU-new3")]
    say_hello(node, boot_id=REBOOT, gpus=replaced, now=later(start, 30))

    assert ("GPU-new3" not in [uuid for _, uuid in inventory(node)])
    review = review_gpu_inventory(node)
    assert [gpu.uuid for gpu in review.difference.missing] == ["GPU-0003"]
    assert [gpu["uuid"] for gpu in review.difference.waiting] == ["GPU-new3"]
    assert [event.signature for event in review.gpu_lost] == ["gpu_lost"]
    assert review.acceptable


def test_accepting_the_replacement_closes_gpu_lost_and_is_audited(node, start, operator):
    replaced = without(EIGHT, "GPU-0003") + [hello_gpu(3, "GPU-new3")]
    say_hello(node, boot_id=REBOOT, gpus=replaced, now=later(start, 30))
    old = Gpu.objects.get(uuid="GPU-0003")
    accepted_at = later(start, 40)

    review = do_accept_gpu_inventory(node, actor=operator, now=accepted_at)

    assert review.acceptable
    assert inventory(node) == [(i, "GPU-new3" if i == 3 else f"GPU-{i:04d}") for i in range(8)]
    old.refresh_from_db()
    assert old.removed_at == accepted_at  # kept for its events' history
    event = HealthEvent.objects.get(node=node, signature="gpu_lost")
    assert event.gpu == old
    assert event.closed_at == accepted_at
    assert event.closed_reason == "GPU inventory accepted by alice"
    assert event.closed_by == operator
    node.refresh_from_db()
    assert node.state == NodeState.HEALTHY
    audit = AuditEntry.objects.get(action="node.accept_gpu_inventory")
    assert (audit.actor, audit.object_repr, audit.cluster) == (operator, "gpu-017", node.cluster)
    assert audit.changes["removed"] == [{"index": 3, "uuid": "GPU-0003"}]
    assert audit.changes["added"] == [{"index": 3, "uuid": "GPU-new3"}]
    assert audit.changes["closed_events"] == [str(event.public_id)]


def test_accepting_a_lost_gpu_renumbers_the_ones_after_it(node, start, operator):
    # NVML numbers the GPUs it finds: after a reboot without GPU 3, GPUs 4-7 are 3-6.
    renumbered = [hello_gpu(i if i < 3 else i - 1, f"GPU-{i:04d}") for i in range(8) if i != 3]
    say_hello(node, boot_id=REBOOT, gpus=renumbered, now=later(start, 30))
    assert HealthEvent.objects.open().get(node=node).gpu.uuid == "GPU-0003"

    do_accept_gpu_inventory(node, actor=operator, now=later(start, 40))

    assert inventory(node) == [(gpu["index"], gpu["uuid"]) for gpu in renumbered]
    assert Gpu.objects.get(uuid="GPU-0004").pci_bus_id == "00000000:00:09.0"
    assert not HealthEvent.objects.open().filter(node=node).exists()


def test_accepting_closes_a_gpu_lost_whose_gpu_came_back(node, start, operator):
    say_hello(node, boot_id=BOOT, gpus=without(EIGHT, "GPU-0003"), now=later(start, 5))
    say_hello(node, boot_id=BOOT, gpus=EIGHT, now=later(start, 6))

    review = review_gpu_inventory(node)
    assert not review.difference and [e.gpu.uuid for e in review.gpu_lost] == ["GPU-0003"]
    do_accept_gpu_inventory(node, actor=operator, now=later(start, 7))

    assert not HealthEvent.objects.open().filter(node=node).exists()
    assert len(inventory(node)) == 8


def test_accepting_leaves_a_gpu_lost_the_agent_saw_on_a_listed_gpu(node, start, operator):
    """NVML said the GPU is lost while it still enumerates: a reboot's check settles that."""
    gpu = Gpu.objects.get(uuid="GPU-0005")
    do_record_health_event(node, signature="gpu_lost", severity="critical", gpu=gpu,
                           message="GPU is lost", evidence={"source": "nvml"},
                           now=later(start, 5))
    say_hello(node, boot_id=BOOT, gpus=without(EIGHT, "GPU-0003"), now=later(start, 6))

    do_accept_gpu_inventory(node, actor=operator, now=later(start, 7))

    assert [e.gpu.uuid for e in HealthEvent.objects.open().filter(node=node)] == ["GPU-0005"]


def test_a_gpu_lost_again_after_acceptance_opens_a_new_event(node, start, operator):
    say_hello(node, boot_id=BOOT, gpus=without(EIGHT, "GPU-0003"), now=later(start, 5))
    say_hello(node, boot_id=BOOT, gpus=EIGHT, now=later(start, 6))
    do_accept_gpu_inventory(node, actor=operator, now=later(start, 7))

    say_hello(node, boot_id=BOOT, gpus=without(EIGHT, "GPU-0003"), now=later(start, 8))

    assert HealthEvent.objects.filter(node=node, signature="gpu_lost").count() == 2
    assert HealthEvent.objects.open().get(node=node).first_seen == later(start, 8)


def test_nothing_to_accept_changes_nothing(node, start, operator):
    review = do_accept_gpu_inventory(node, actor=operator, now=later(start, 5))

    assert not review.acceptable and not review.problem
    assert not AuditEntry.objects.filter(action="node.accept_gpu_inventory").exists()


def test_a_node_without_a_recorded_hello_has_nothing_to_accept(cluster, operator):
    node = do_register_node(cluster, "gpu-018")
    review = do_accept_gpu_inventory(node, actor=operator)
    assert review.problem == "no hello with a GPU list has been recorded yet"


def test_a_repair_accepts_as_the_system(node, start):
    say_hello(node, boot_id=REBOOT, gpus=without(EIGHT, "GPU-0003"), now=later(start, 30))

    do_accept_gpu_inventory(node, actor=None, now=later(start, 40))

    event = HealthEvent.objects.get(node=node)
    assert event.closed_reason == "GPU inventory accepted by system"
    assert AuditEntry.objects.get(action="node.accept_gpu_inventory").actor_name == "system"
