from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from clusters.models import AuditEntry
from healthchecks.models import HealthEvent, Silence
from healthchecks.services import close_quiet_events, do_record_health_event, refresh_ended_silences
from nodes.choices import NodeState
from nodes.states import refresh_node_state
from nodes.tests.factories import GpuFactory, NodeFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def event(cluster):
    node = NodeFactory(cluster=cluster, name="gpu-017")
    gpu = GpuFactory(node=node, index=3)
    return do_record_health_event(node, signature="xid:79", severity="critical", gpu=gpu,
                                  message="GPU has fallen off the bus",
                                  evidence={"kernel_line": "NVRM: Xid (PCI:0000:00:09): 79, GPU has "
                                                    "fallen off the bus."})


def url(event, action):
    return reverse(f"healthchecks:{action}", args=[event.node.cluster.slug, event.public_id])


def test_the_tab_shows_the_catalog_and_gpuds_view(client_for, viewer, event):
    response = client_for(viewer).get(reverse("healthchecks:list", args=["prod-h200"]))
    text = response.text
    assert "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS" in text
    assert "NVIDIA: restart the machine (RESTART_BM)" in text and "gpud: REBOOT_SYSTEM, HARDWARE_INSPECTION" in text
    assert "NVRM: Xid (PCI:0000:00:09): 79" in text
    assert "Acknowledge" not in text  # viewers see no actions


def test_an_operator_acknowledges_an_event(client_for, operator, event):
    response = client_for(operator).post(url(event, "acknowledge"), HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert response.text.lstrip().startswith(f'<tr id="event-{event.public_id}">')
    assert "acknowledged by alice" in response.text
    event.refresh_from_db()
    assert event.is_open and event.acknowledged_by == operator
    assert AuditEntry.objects.get().action == "healthevent.acknowledge"


def test_an_operator_resolves_an_event_with_a_comment(client_for, operator, event, settings):
    settings.CLUSTERUI_BOOT_WINDOW_S = 0
    node = event.node
    refresh_node_state(node)
    node.refresh_from_db()
    assert node.state == NodeState.UNHEALTHY

    response = client_for(operator).post(url(event, "resolve"), {"comment": "GPU reseated"})

    assert response.status_code == 302
    event.refresh_from_db()
    assert event.closed_reason == "resolved by alice: GPU reseated" and event.closed_by == operator
    node.refresh_from_db()
    assert node.state == NodeState.HEALTHY
    assert AuditEntry.objects.get().changes == {"comment": "GPU reseated"}


def test_resolving_needs_a_comment(client_for, operator, event):
    response = client_for(operator).post(url(event, "resolve"), {}, HTTP_HX_REQUEST="true")
    assert "resolving needs a comment" in response.text
    event.refresh_from_db()
    assert event.is_open


def test_a_silenced_signature_stops_counting_against_the_node(client_for, operator, event,
                                                               settings):
    settings.CLUSTERUI_BOOT_WINDOW_S = 0
    client_for(operator).post(url(event, "silence"), {"hours": "2", "reason": "known, RMA open"})
    node = event.node
    node.refresh_from_db()
    assert node.state == NodeState.HEALTHY
    silence = Silence.objects.get()
    assert (silence.signature, silence.created_by) == ("xid:79", operator)
    assert AuditEntry.objects.get().action == "silence.create"

    later = silence.until + timedelta(seconds=1)
    assert refresh_ended_silences(since=silence.until - timedelta(minutes=2), now=later) == 1
    node.refresh_from_db()
    assert node.state == NodeState.UNHEALTHY  # the silence ended, the event is still open


@pytest.mark.parametrize("action", ["acknowledge", "resolve", "silence"])
def test_actions_refuse_get_and_viewers(client_for, viewer, operator, event, action):
    assert client_for(operator).get(url(event, action)).status_code == 405
    assert client_for(viewer).post(url(event, action), {"comment": "x", "hours": "1",
                                                        "reason": "x"}).status_code == 403
    event.refresh_from_db()
    assert event.is_open and event.acknowledged_at is None and not Silence.objects.exists()


def test_an_event_of_another_cluster_is_a_404(client_for, operator, event):
    from clusters.tests.factories import ClusterFactory

    other = ClusterFactory(slug="other")
    response = client_for(operator).post(
        reverse("healthchecks:acknowledge", args=[other.slug, event.public_id]))
    assert response.status_code == 404


def test_quiet_info_xids_close_after_an_hour(cluster):
    node = NodeFactory(cluster=cluster)
    now = timezone.now()
    app_fault = do_record_health_event(node, signature="xid:13", severity="info",
                                       now=now - timedelta(minutes=61))
    recent = do_record_health_event(node, signature="xid:94", severity="info",
                                    now=now - timedelta(minutes=30))
    hardware = do_record_health_event(node, signature="xid:79", severity="critical",
                                      now=now - timedelta(hours=5))
    assert close_quiet_events(now=now) == 1
    states = {e.signature: e.is_open for e in HealthEvent.objects.all()}
    assert states == {"xid:13": False, "xid:94": True, "xid:79": True}
    assert HealthEvent.objects.get(pk=app_fault.pk).closed_reason == "no repeat for an hour"
    assert recent and hardware
