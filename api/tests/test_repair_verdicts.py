"""Rejecting and cancelling through the API choose a snooze, checked by the page's form;
asking for a recommendation again."""

import pytest
from django.urls import reverse

from api.tests.conftest import Role
from healthchecks.services import do_record_health_event
from nodes.tests.factories import GpuFactory, NodeFactory
from repairs.services import refresh_recommendation

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_tasks(monkeypatch):
    monkeypatch.setattr("repairs.services.enqueue_step", lambda step_id: None)


@pytest.fixture
def proposed(cluster):
    node = NodeFactory(cluster=cluster, name="gpu-011")
    gpu = GpuFactory(node=node, index=3)
    do_record_health_event(node, signature="xid:79", severity="critical", gpu=gpu,
                           message="GPU has fallen off the bus")
    return refresh_recommendation(node)


def test_reject_with_a_snooze_and_an_unknown_snooze_is_refused(api_as, proposed):
    client, _ = api_as(Role.OPERATOR)
    url = reverse("api:reject_repair", args=[proposed.cluster.slug, proposed.public_id])
    bad = client.post(url, {"snooze": "forever"})
    assert bad.status_code == 400 and "snooze" in bad.json()["detail"]
    answer = client.post(url, {"comment": "after the run", "snooze": "7d"})
    assert answer.status_code == 200
    body = answer.json()
    assert body["status"] == "rejected" and body["snooze_until"] is not None


def test_recommend_again_proposes_what_a_rejection_held_back(api_as, proposed):
    client, _ = api_as(Role.OPERATOR)
    slug, node = proposed.cluster.slug, proposed.node.name
    client.post(reverse("api:reject_repair", args=[slug, proposed.public_id]), {})
    answer = client.post(reverse("api:recommend_again", args=[slug, node]))
    assert answer.status_code == 200
    assert answer.json()["action"] == "reboot" and answer.json()["number"] != proposed.pk
