"""The node page's GPU inventory: what differs from the latest hello, and accepting it."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from clusters.models import AuditEntry
from healthchecks.models import HealthEvent
from nodes.models import Gpu
from healthchecks.tests.factories import say_hello
from nodes.services import do_register_node

pytestmark = pytest.mark.django_db


def hello_gpu(index, uuid):
    return {"index": index, "uuid": uuid, "name": "NVIDIA H200",
            "pci_bus_id": f"00000000:00:{6 + index:02X}.0", "memory_total_bytes": 150754820096}


@pytest.fixture
def node(cluster):
    """A node whose GPU 3 was replaced: the hello after the repair lists a new GPU there."""
    start = timezone.now() - timedelta(hours=1)
    node = do_register_node(cluster, "gpu-017", now=start)
    gpus = [hello_gpu(i, f"GPU-{i:04d}") for i in range(8)]
    say_hello(node, boot_id="boot-1", gpus=gpus, now=start)
    gpus[3] = hello_gpu(3, "GPU-new3")
    return say_hello(node, boot_id="boot-2", gpus=gpus, now=start + timedelta(minutes=30))


def accept_url(node):
    return reverse("healthchecks:accept_gpu_inventory", args=[node.cluster.slug, node.name])


def test_the_node_page_shows_what_accepting_changes(client_for, operator, node):
    response = client_for(operator).get(node.get_absolute_url())

    text = response.text
    assert "GPU 3 <span class=\"mono\">GPU-0003</span> is not in it: leaves the inventory" in text
    assert "<span class=\"mono\">GPU-new3</span> (NVIDIA H200" in text
    assert "closes gpu_lost on GPU 3" in text
    assert "missing since" in text
    assert "Accept the latest hello as the inventory" in text


def test_viewers_see_the_difference_without_the_button(client_for, viewer, node):
    text = client_for(viewer).get(node.get_absolute_url()).text
    assert "is not in it: leaves the inventory" in text
    assert "Accept the latest hello" not in text


def test_an_operator_accepts_the_inventory(client_for, operator, node):
    response = client_for(operator).post(accept_url(node))

    assert response.status_code == 302 and response.url == node.get_absolute_url()
    assert Gpu.objects.in_inventory().get(node=node, index=3).uuid == "GPU-new3"
    assert not HealthEvent.objects.open().filter(node=node).exists()
    assert AuditEntry.objects.get(action="node.accept_gpu_inventory").actor == operator
    page = client_for(operator).get(node.get_absolute_url()).text
    assert "gpu-017: GPU inventory accepted, 1 gpu_lost closed." in page
    assert "Accept the latest hello" not in page


def test_accepting_over_htmx_returns_the_gpu_panel(client_for, operator, node):
    response = client_for(operator).post(accept_url(node), HTTP_HX_REQUEST="true")

    assert response.status_code == 200
    assert response.text.lstrip().startswith('<section class="panel" id="gpu-inventory"')
    assert "GPU-new3" in response.text and "GPU-0003" not in response.text
    assert 'id="messages" class="messages" role="status" hx-swap-oob="true"' in response.text
    assert "GPU inventory accepted" in response.text


def test_accepting_twice_says_there_is_nothing_left(client_for, operator, node):
    client = client_for(operator)
    client.post(accept_url(node))
    response = client.post(accept_url(node), HTTP_HX_REQUEST="true")
    assert "gpu-017: nothing to accept." in response.text
    assert AuditEntry.objects.filter(action="node.accept_gpu_inventory").count() == 1


def test_accepting_refuses_get(client_for, operator, node):
    assert client_for(operator).get(accept_url(node)).status_code == 405


def test_viewers_cannot_accept(client_for, viewer, node):
    assert client_for(viewer).post(accept_url(node)).status_code == 403
    assert HealthEvent.objects.open().filter(node=node, signature="gpu_lost").exists()


def test_the_node_list_counts_only_the_inventory(client_for, operator, viewer, node):
    client_for(operator).post(accept_url(node))
    response = client_for(viewer).get(reverse("nodes:list", args=[node.cluster.slug]))
    (row,) = response.context["page"].object_list
    assert row.gpu_count == 8  # the replaced GPU's row stays, out of the inventory
    assert Gpu.objects.filter(node=node).count() == 9
