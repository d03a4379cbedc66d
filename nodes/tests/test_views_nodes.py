import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from clusters.models import AuditEntry
from healthchecks.models import HealthEvent
from nodes.choices import NodeState
from nodes.models import Gpu, Node

from .factories import GpuFactory, NodeFactory, NodeTransitionFactory

pytestmark = pytest.mark.django_db


def list_url(cluster, query=""):
    return reverse("nodes:list", args=[cluster.slug]) + query


def test_the_list_shows_each_node_with_its_gpus(client_for, viewer, cluster):
    node = NodeFactory(cluster=cluster, name="gpu-017", state=NodeState.UNHEALTHY,
                       state_reason="xid:79 on GPU 3")
    GpuFactory.create_batch(8, node=node)

    response = client_for(viewer).get(list_url(cluster))

    (row,) = response.context["page"].object_list
    assert (row.name, row.gpu_count) == ("gpu-017", 8)
    assert "xid:79 on GPU 3" in response.text
    assert 'href="/c/prod-h200/nodes/gpu-017/"' in response.text


def test_the_list_filters_by_state_and_name(client_for, viewer, cluster):
    NodeFactory(cluster=cluster, name="gpu-001", state=NodeState.HEALTHY)
    NodeFactory(cluster=cluster, name="gpu-002", state=NodeState.PAUSED)
    NodeFactory(cluster=cluster, name="cpu-001", state=NodeState.PAUSED)
    client = client_for(viewer)

    def names(query):
        return [n.name for n in client.get(list_url(cluster, query)).context["page"]]

    assert names("?state=paused") == ["cpu-001", "gpu-002"]
    assert names("?name=gpu") == ["gpu-002", "gpu-001"]  # worst first: paused, then healthy
    assert names("?state=paused&name=gpu") == ["gpu-002"]
    assert names("?state=nonsense") == []  # an invalid filter shows nothing, not everything
    assert "Select a valid choice" in client.get(list_url(cluster, "?state=nonsense")).text
    assert "No node matches these filters." in client.get(list_url(cluster, "?name=zzz")).text


def test_an_htmx_request_gets_only_the_table(client_for, viewer, cluster):
    NodeFactory(cluster=cluster)
    response = client_for(viewer).get(list_url(cluster, "?page=1"), HTTP_HX_REQUEST="true")
    assert response.text.lstrip().startswith('<div id="node-table"')


def test_list_queries_do_not_grow_with_the_number_of_nodes(client_for, viewer, cluster):
    client = client_for(viewer)
    now = timezone.now()

    def add(start, count):
        nodes = Node.objects.bulk_create(
            Node(cluster=cluster, name=f"n{i:05d}", state=NodeState.HEALTHY, joined_at=now)
            for i in range(start, start + count)
        )
        Gpu.objects.bulk_create(
            Gpu(node=n, index=i, uuid=f"GPU-{n.name}-{i}") for n in nodes for i in range(8)
        )

    add(0, 10)
    client.get(list_url(cluster))
    with CaptureQueriesContext(connection) as at_10:
        client.get(list_url(cluster))
    add(10, 1990)
    with CaptureQueriesContext(connection) as at_2000:
        response = client.get(list_url(cluster, "?page=3"))
    assert response.context["page"].paginator.count == 2000
    assert len(at_2000) == len(at_10)


def test_the_node_page_shows_gpus_events_and_transitions(client_for, viewer, cluster):
    node = NodeFactory(cluster=cluster, name="gpu-017")
    gpu = GpuFactory(node=node, index=3, uuid="GPU-dd6e0000")
    HealthEvent.objects.create(node=node, gpu=gpu, signature="xid:79", severity="critical",
                               message="GPU has fallen off the bus", first_seen=timezone.now(),
                               last_seen=timezone.now())
    NodeTransitionFactory(node=node, reason="xid:79 opened")

    response = client_for(viewer).get(node.get_absolute_url())

    assert response.status_code == 200
    for text in ["GPU-dd6e0000", "140.4 GiB", "GPU has fallen off the bus", "xid:79 opened"]:
        assert text in response.text
    assert "Pause" not in response.text  # viewers see no operations


def test_a_missing_node_is_a_404(client_for, viewer, cluster):
    assert client_for(viewer).get(list_url(cluster, "gpu-999/")).status_code == 404


def test_an_operator_pauses_and_resumes_a_node(client_for, operator, cluster):
    node = NodeFactory(cluster=cluster)
    client = client_for(operator)

    response = client.post(reverse("nodes:pause", args=[cluster.slug, node.name]),
                           {"reason": "replace PSU"})
    assert response.status_code == 302
    node.refresh_from_db()
    assert node.state == NodeState.PAUSED and node.state_reason == "paused by alice: replace PSU"

    client.post(reverse("nodes:resume", args=[cluster.slug, node.name]))
    node.refresh_from_db()
    assert node.state == NodeState.HEALTHY
    assert [a.action for a in AuditEntry.objects.order_by("id")] == ["node.pause", "node.resume"]


def test_pause_needs_a_reason(client_for, operator, cluster):
    node = NodeFactory(cluster=cluster)
    client_for(operator).post(reverse("nodes:pause", args=[cluster.slug, node.name]), {})
    node.refresh_from_db()
    assert not node.paused


def test_pause_over_htmx_returns_the_status_panel(client_for, operator, cluster):
    node = NodeFactory(cluster=cluster)
    response = client_for(operator).post(
        reverse("nodes:pause", args=[cluster.slug, node.name]), {"reason": "bios"},
        HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert response.text.lstrip().startswith('<section class="panel" id="node-status">')
    assert "Resume" in response.text and "paused." in response.text


@pytest.mark.parametrize("action", ["pause", "resume"])
def test_operations_refuse_get(client_for, operator, cluster, action):
    node = NodeFactory(cluster=cluster)
    url = reverse(f"nodes:{action}", args=[cluster.slug, node.name])
    assert client_for(operator).get(url).status_code == 405


@pytest.mark.parametrize("action", ["pause", "resume"])
def test_viewers_cannot_operate(client_for, viewer, cluster, action):
    node = NodeFactory(cluster=cluster, paused=(action == "resume"))
    url = reverse(f"nodes:{action}", args=[cluster.slug, node.name])
    assert client_for(viewer).post(url, {"reason": "x"}).status_code == 403
    assert Node.objects.get(pk=node.pk).paused == (action == "resume")
