import pytest
from django.urls import reverse
from django.utils import timezone

from healthchecks.models import HealthEvent
from nodes.tests.factories import NodeFactory

pytestmark = pytest.mark.django_db


def event(node, signature, severity="critical", closed=False):
    now = timezone.now()
    return HealthEvent.objects.create(node=node, signature=signature, severity=severity,
                                      first_seen=now, last_seen=now,
                                      closed_at=now if closed else None)


def test_the_tab_lists_the_clusters_events_with_filters(client_for, viewer, cluster):
    node = NodeFactory(cluster=cluster, name="gpu-017")
    event(node, "xid:79")
    event(node, "thermal_throttle", "warning", closed=True)
    event(NodeFactory(), "xid:48")  # another cluster
    client = client_for(viewer)
    url = reverse("healthchecks:list", args=[cluster.slug])

    def signatures(query=""):
        return sorted(e.signature for e in client.get(url + query).context["page"])

    assert signatures() == ["thermal_throttle", "xid:79"]
    assert signatures("?severity=warning") == ["thermal_throttle"]
    assert signatures("?open=true") == ["xid:79"]
    assert signatures("?node=gpu-0") == ["thermal_throttle", "xid:79"]
    assert client.get(url, HTTP_HX_REQUEST="true").text.lstrip().startswith('<div id="event-table">')


def test_the_repair_tab_lists_nodes_out_of_service(client_for, viewer, cluster):
    NodeFactory(cluster=cluster, name="gpu-001", state="healthy")
    NodeFactory(cluster=cluster, name="gpu-002", state="unhealthy", state_reason="xid:79 on GPU 3")
    NodeFactory(cluster=cluster, name="gpu-003", state="paused")
    response = client_for(viewer).get(reverse("repairs:list", args=[cluster.slug]))
    assert sorted(n.name for n in response.context["nodes"]) == ["gpu-002", "gpu-003"]
    assert "xid:79 on GPU 3" in response.text
