"""Approve, reject, cancel: one click each, operators only; the second of two clicks gets a
clear message, never a 500; htmx gets the repair's block back, a plain form goes back."""

import json

import pytest
from django.urls import reverse
from django.utils import timezone

from clusters.models import AuditEntry
from clusters.roles import Role
from clusters.tests.factories import ClusterFactory, UserFactory
from healthchecks.services import do_record_health_event
from nodes.tests.factories import GpuFactory, NodeFactory
from repairs import services
from repairs.choices import Status
from repairs.models import Repair, RepairTransition
from repairs.services import refresh_recommendation
from repairs.tests.factories import RepairFactory
from repairs.transitions import transition

pytestmark = pytest.mark.django_db


@pytest.fixture
def repair(cluster):
    node = NodeFactory(cluster=cluster, name="gpu-017")
    gpu = GpuFactory(node=node, index=3)
    do_record_health_event(node, signature="xid:79", severity="critical", gpu=gpu,
                           message="GPU has fallen off the bus")
    return refresh_recommendation(node)


@pytest.fixture
def bob(db):
    return UserFactory(username="bob", role=Role.OPERATOR)


def url(repair, action):
    return reverse(f"repairs:{action}", args=[repair.cluster.slug, repair.public_id])


def messages_of(response):
    return [str(m) for m in response.context["messages"]]


def test_an_operator_approves_with_one_click(client_for, operator, repair):
    response = client_for(operator).post(url(repair, "approve"), {"comment": "go"},
                                         HTTP_HX_REQUEST="true")

    assert response.status_code == 200
    text = response.text.lstrip()
    assert text.startswith(f'<article class="repair" id="repair-{repair.public_id}">')
    assert "running" in text and "drain" in text  # its steps
    assert f"Repair #{repair.pk} approved; it is running." in text
    assert 'id="messages" class="messages" role="status" hx-swap-oob="true"' in text
    assert "repair-changed" in json.loads(response["HX-Trigger"])
    repair.refresh_from_db()
    assert repair.status == Status.RUNNING
    assert (repair.reviewed_by, repair.review_comment) == (operator, "go")
    assert AuditEntry.objects.get(action="repair.approve").actor == operator


def test_an_approval_held_back_by_the_blast_radius_says_why(client_for, operator, repair,
                                                            cluster):
    RepairFactory(node=NodeFactory(cluster=cluster), status=Status.RUNNING,
                  started_at=timezone.now())
    response = client_for(operator).post(url(repair, "approve"), HTTP_HX_REQUEST="true")
    repair.refresh_from_db()
    assert repair.status == Status.WAITING
    assert f"Repair #{repair.pk} approved; it waits: 1 of 2 nodes are out of service" in (
        response.text)
    assert "Waiting to start: 1 of 2 nodes" in response.text


def test_a_double_click_approves_once_and_says_so(client_for, operator, repair):
    client = client_for(operator)
    client.post(url(repair, "approve"), HTTP_HX_REQUEST="true")
    second = client.post(url(repair, "approve"), HTTP_HX_REQUEST="true")

    assert second.status_code == 200
    assert f"Repair #{repair.pk} was already approved by alice; it is running now." in (
        second.text)
    assert 'class="message warning"' in second.text
    assert RepairTransition.objects.filter(repair=repair, to_status=Status.APPROVED).count() == 1
    assert AuditEntry.objects.filter(action="repair.approve").count() == 1


def test_a_second_operator_learns_who_approved_first(client_for, operator, bob, repair):
    client_for(operator).post(url(repair, "approve"))
    response = client_for(bob).post(url(repair, "reject"), {"comment": "no"}, follow=True)
    assert f"Repair #{repair.pk} was already approved by alice; it is running now." in (
        messages_of(response))
    repair.refresh_from_db()
    assert repair.status == Status.RUNNING and repair.reviewed_by == operator


def test_a_race_lost_inside_the_service_gets_the_same_message(client_for, operator, bob,
                                                              repair, monkeypatch):
    """The repair was read as proposed, and bob approved it before the conditional update:
    the service raises Conflict."""
    approve = services.do_approve_repair

    def bob_first(stale, **kwargs):
        approve(Repair.objects.get(pk=stale.pk), actor=bob, comment="mine")
        return approve(stale, **kwargs)

    monkeypatch.setattr("repairs.views.do_approve_repair", bob_first)
    response = client_for(operator).post(url(repair, "approve"), HTTP_HX_REQUEST="true")

    assert response.status_code == 200
    assert f"Repair #{repair.pk} was already approved by bob; it is running now." in (
        response.text)
    repair.refresh_from_db()
    assert repair.reviewed_by == bob


def test_an_operator_rejects_with_a_comment(client_for, operator, repair):
    response = client_for(operator).post(url(repair, "reject"), {"comment": "known bad cable"},
                                         HTTP_HX_REQUEST="true")
    assert f"Repair #{repair.pk} rejected." in response.text
    assert "rejected by alice" in response.text and "known bad cable" in response.text
    assert ">Approve</button>" not in response.text
    repair.refresh_from_db()
    assert repair.status == Status.REJECTED and repair.review_comment == "known bad cable"

    again = client_for(operator).post(url(repair, "approve"), HTTP_HX_REQUEST="true")
    assert f"Repair #{repair.pk} was already rejected by alice." in again.text


def test_an_approved_or_waiting_repair_can_be_cancelled(client_for, operator, cluster):
    for status in (Status.APPROVED, Status.WAITING):
        repair = RepairFactory(node=NodeFactory(cluster=cluster), status=status)
        response = client_for(operator).post(url(repair, "cancel"), {"comment": "maintenance"},
                                             HTTP_HX_REQUEST="true")
        assert f"Repair #{repair.pk} cancelled." in response.text
        repair.refresh_from_db()
        assert repair.status == Status.CANCELLED and repair.outcome == "cancelled by alice"
    assert AuditEntry.objects.filter(action="repair.cancel").count() == 2


def test_a_running_repair_cannot_be_cancelled(client_for, operator, cluster):
    repair = RepairFactory(node=NodeFactory(cluster=cluster), status=Status.RUNNING)
    response = client_for(operator).post(url(repair, "cancel"), HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert "a running repair cannot be cancelled" in response.text
    repair.refresh_from_db()
    assert repair.status == Status.RUNNING


def test_a_resolved_repair_says_how_it_ended(client_for, operator, cluster):
    repair = RepairFactory(node=NodeFactory(cluster=cluster))
    transition(repair, Status.RESOLVED,
                        reason="its events closed and stayed closed for 5 minutes")
    response = client_for(operator).post(url(repair, "approve"), HTTP_HX_REQUEST="true")
    assert (f"Repair #{repair.pk} is already resolved (system: its events closed and stayed "
            f"closed for 5 minutes).") in response.text


def test_a_plain_form_goes_back_where_it_came_from(client_for, operator, repair):
    tab = reverse("repairs:list", args=[repair.cluster.slug])
    response = client_for(operator).post(url(repair, "approve"), {"next": tab})
    assert response.status_code == 302 and response["Location"] == tab


def test_a_next_on_another_host_is_ignored(client_for, operator, repair):
    response = client_for(operator).post(url(repair, "reject"),
                                         {"next": "https://evil.example/phish"})
    assert response.status_code == 302 and response["Location"] == repair.get_absolute_url()


def test_a_too_long_comment_changes_nothing(client_for, operator, repair):
    response = client_for(operator).post(url(repair, "approve"), {"comment": "x" * 501},
                                         HTTP_HX_REQUEST="true")
    assert "The comment is too long" in response.text
    repair.refresh_from_db()
    assert repair.status == Status.PROPOSED


@pytest.mark.parametrize("action", ["approve", "reject", "cancel"])
def test_actions_refuse_get_viewers_and_users_without_a_role(client_for, operator, viewer,
                                                             outsider, repair, action):
    assert client_for(operator).get(url(repair, action)).status_code == 405
    assert client_for(viewer).post(url(repair, action)).status_code == 403
    assert client_for(outsider).post(url(repair, action)).status_code == 403
    repair.refresh_from_db()
    assert repair.status == Status.PROPOSED and not AuditEntry.objects.exists()


@pytest.mark.parametrize("action", ["approve", "reject", "cancel"])
def test_a_repair_of_another_cluster_is_a_404(client_for, operator, repair, action):
    other = ClusterFactory(slug="other")
    response = client_for(operator).post(
        reverse(f"repairs:{action}", args=[other.slug, repair.public_id]))
    assert response.status_code == 404
    repair.refresh_from_db()
    assert repair.status == Status.PROPOSED
