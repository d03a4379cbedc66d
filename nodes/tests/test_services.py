from datetime import timedelta

import pytest
from django.utils import timezone

from clusters.models import AuditEntry
from healthchecks.services import do_close_health_event, do_record_health_event
from nodes.choices import NodeState
from nodes.services import do_pause_node, do_record_hello, do_register_node, do_resume_node
from nodes.states import refresh_due_node_states

H200 = {"name": "NVIDIA H200", "memory_total_bytes": 150754820096}


def gpus(n=8):
    return [{"index": i, "uuid": f"GPU-{i:08x}-aaaa", "pci_bus_id": f"00000000:{i + 6:02X}:00.0",
             **H200} for i in range(n)]


def states(node):
    return [(t.from_state, t.to_state) for t in node.transitions.order_by("at", "id")]


@pytest.mark.django_db
def test_a_node_lives_through_its_states(cluster, operator, settings):
    settings.CLUSTERUI_BOOT_WINDOW_S = 120
    t0 = timezone.now() - timedelta(hours=1)

    node = do_register_node(cluster, "gpu-001", now=t0)
    assert node.state == NodeState.PENDING

    node = do_record_hello(node, boot_id="boot-a", agent_version="1.0.0", gpus=gpus(), now=t0)
    assert node.state == NodeState.BOOTING
    assert node.gpus.count() == 8

    refresh_due_node_states(now=t0 + timedelta(minutes=3))
    node.refresh_from_db()
    assert node.state == NodeState.HEALTHY

    gpu3 = node.gpus.get(index=3)
    event = do_record_health_event(node, signature="xid:79", severity="critical", gpu=gpu3,
                                   message="GPU has fallen off the bus",
                                   now=t0 + timedelta(minutes=10))
    node.refresh_from_db()
    assert (node.state, node.state_reason) == (NodeState.UNHEALTHY, "xid:79 on GPU 3")

    do_pause_node(node, actor=operator, reason="reseat GPU 3", now=t0 + timedelta(minutes=11))
    node.refresh_from_db()
    assert node.state == NodeState.PAUSED
    assert node.state_reason == "paused by alice: reseat GPU 3"

    do_close_health_event(event, reason="GPU reseated", actor=operator,
                          now=t0 + timedelta(minutes=20))
    node.refresh_from_db()
    assert node.state == NodeState.PAUSED  # paused wins over everything

    do_resume_node(node, actor=operator, now=t0 + timedelta(minutes=21))
    node.refresh_from_db()
    assert node.state == NodeState.HEALTHY
    assert states(node) == [
        ("", "pending"), ("pending", "booting"), ("booting", "healthy"),
        ("healthy", "unhealthy"), ("unhealthy", "paused"), ("paused", "healthy"),
    ]
    assert list(AuditEntry.objects.values_list("action", "actor_name").order_by("id")) == [
        ("node.pause", "alice"), ("node.resume", "alice")]


@pytest.mark.django_db
def test_a_reconnect_with_the_same_boot_id_is_not_a_reboot(cluster):
    t0 = timezone.now() - timedelta(hours=1)
    node = do_register_node(cluster, "gpu-002", now=t0)
    do_record_hello(node, boot_id="boot-a", gpus=gpus(2), now=t0)
    refresh_due_node_states(now=t0 + timedelta(minutes=5))

    node = do_record_hello(node, boot_id="boot-a", gpus=gpus(2), now=t0 + timedelta(minutes=30))
    assert node.state == NodeState.HEALTHY
    assert node.booted_at == t0

    node = do_record_hello(node, boot_id="boot-b", gpus=gpus(2), now=t0 + timedelta(minutes=40))
    assert node.state == NodeState.BOOTING
    assert node.transitions.first().reason == "rebooted (new boot id)"


@pytest.mark.django_db
def test_an_info_event_does_not_make_a_node_unhealthy(cluster):
    node = do_register_node(cluster, "gpu-003", now=timezone.now() - timedelta(hours=1))
    do_record_hello(node, boot_id="b", now=timezone.now() - timedelta(hours=1))
    refresh_due_node_states()
    do_record_health_event(node, signature="xid:13", severity="info", message="app fault")
    node.refresh_from_db()
    assert node.state == NodeState.HEALTHY


@pytest.mark.django_db
def test_a_repeated_signal_raises_the_count_of_the_open_event(cluster):
    node = do_register_node(cluster, "gpu-004")
    first = do_record_health_event(node, signature="thermal_throttle", severity="warning")
    again = do_record_health_event(node, signature="thermal_throttle", severity="warning", count=4)
    assert again.pk == first.pk and again.count == 5


@pytest.mark.django_db
def test_pausing_twice_pauses_once(cluster, operator):
    node = do_register_node(cluster, "gpu-005")
    assert do_pause_node(node, actor=operator, reason="bios update") is True
    assert do_pause_node(node, actor=operator, reason="bios update") is False
    assert do_resume_node(node, actor=operator) is True
    assert do_resume_node(node, actor=operator) is False
    assert AuditEntry.objects.count() == 2


@pytest.mark.django_db
def test_node_names_follow_the_protocol(cluster):
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError):
        do_register_node(cluster, "bad name/with slash")


@pytest.mark.django_db
def test_a_replaced_gpu_does_not_join_the_inventory_by_itself(cluster):
    node = do_register_node(cluster, "gpu-006")
    do_record_hello(node, boot_id="a", gpus=gpus(2))
    replaced = [gpus(2)[0], {**gpus(2)[1], "uuid": "GPU-new-board"}]
    node = do_record_hello(node, boot_id="b", gpus=replaced)
    assert sorted(node.gpus.values_list("index", "uuid")) == [(0, "GPU-00000000-aaaa"),
                                                              (1, "GPU-00000001-aaaa")]
