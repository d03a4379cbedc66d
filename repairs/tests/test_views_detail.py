"""A repair's page: its transitions (who, when, why), its steps with their output, its
events, and cancel while it is proposed, approved or waiting."""

import pytest
from django.urls import reverse
from django.utils import timezone

from clusters.tests.factories import ClusterFactory
from healthchecks.services import do_record_health_event
from nodes.tests.factories import GpuFactory, NodeFactory
from repairs.choices import Status, StepKind, StepStatus
from repairs.models import RepairStep
from repairs.services import do_approve_repair, refresh_recommendation
from repairs.tests.factories import RepairFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def repair(cluster):
    node = NodeFactory(cluster=cluster, name="gpu-017")
    gpu = GpuFactory(node=node, index=3)
    do_record_health_event(node, signature="xid:79", severity="critical", gpu=gpu,
                           message="GPU has fallen off the bus")
    return refresh_recommendation(node)


def test_the_page_shows_transitions_steps_and_events(client_for, operator, viewer, repair):
    do_approve_repair(repair, actor=operator, comment="reboot it tonight")
    drain = repair.steps.get(kind=StepKind.DRAIN)
    RepairStep.objects.filter(pk=drain.pk).update(
        status=StepStatus.DONE, attempts=1, message="drained (slurm)",
        output="$ scontrol update nodename=gpu-017 state=drain reason='clusterui repair #1'")
    earlier = RepairFactory(node=repair.node, status=Status.SUCCEEDED,
                            requested_at=timezone.now(), finished_at=timezone.now())

    response = client_for(viewer).get(repair.get_absolute_url())

    assert response.status_code == 200
    text = response.text
    transitions = text.split('id="repair-transitions-h"')[1]
    assert "proposed &rarr; <strong>approved</strong>" in transitions
    assert "alice" in transitions and "reboot it tonight" in transitions
    assert "approved &rarr; <strong>running</strong>" in transitions
    assert "drained (slurm)" in text and "state=drain reason=" in text
    assert "<details><summary>output</summary>" in text
    assert "GPU has fallen off the bus" in text
    assert "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS" in text
    assert f"#{earlier.pk} reboot" in text  # the node's earlier repairs
    assert "Cancel" not in text  # a viewer; and a running repair has none


def test_operators_can_cancel_a_proposed_repair_here(client_for, operator, viewer, repair):
    text = client_for(operator).get(repair.get_absolute_url()).text
    assert reverse("repairs:cancel", args=[repair.cluster.slug, repair.public_id]) in text
    assert ">Approve</button>" in text and ">Reject</button>" in text
    assert "No transitions yet" in text

    assert "Cancel" not in client_for(viewer).get(repair.get_absolute_url()).text


def test_a_finished_repair_says_how_it_ended(client_for, operator, cluster):
    repair = RepairFactory(node=NodeFactory(cluster=cluster), status=Status.FAILED,
                           started_at=timezone.now(), finished_at=timezone.now(),
                           outcome="verify: gpu_compute failed on GPU 3")
    text = client_for(operator).get(repair.get_absolute_url()).text
    assert "Failed" in text and "verify: gpu_compute failed on GPU 3" in text
    assert "Cancel" not in text and "Approve" not in text


def test_an_htmx_request_gets_the_pages_live_part(client_for, viewer, repair):
    response = client_for(viewer).get(repair.get_absolute_url(), HTTP_HX_REQUEST="true")
    text = response.text.strip()
    assert text.startswith('<div id="repair-detail"')
    assert "<html" not in text


def test_other_clusters_and_users_without_a_role(client_for, viewer, outsider, repair):
    other = ClusterFactory(slug="other")
    response = client_for(viewer).get(
        reverse("repairs:detail", args=[other.slug, repair.public_id]))
    assert response.status_code == 404
    assert client_for(outsider).get(repair.get_absolute_url()).status_code == 403
