"""The node page's Repair section: the node's open repair with its buttons, its history, and
proposing a repair by hand."""

import json

import pytest
from django.urls import reverse
from django.utils import timezone

from clusters.models import AuditEntry
from healthchecks.services import do_record_health_event
from nodes.tests.factories import NodeFactory
from repairs.choices import Status
from repairs.models import Repair
from repairs.tests.factories import RepairFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def node(cluster):
    return NodeFactory(cluster=cluster, name="gpu-017")


def page(node):
    return reverse("nodes:detail", args=[node.cluster.slug, node.name])


def propose_url(node):
    return reverse("repairs:propose", args=[node.cluster.slug, node.name])


def test_the_node_page_shows_its_open_repair_and_history(client_for, operator, node):
    repair = RepairFactory(node=node)
    earlier = RepairFactory(node=node, status=Status.SUCCEEDED, outcome="healthy again",
                            requested_at=timezone.now(), finished_at=timezone.now())
    RepairFactory(node=NodeFactory(cluster=node.cluster), status=Status.FAILED,
                  outcome="another node's")

    text = client_for(operator).get(page(node)).text

    section = text.split('id="node-repairs"')[1].split("</section>")[0]
    assert f'id="repair-{repair.public_id}"' in section and ">Approve</button>" in section
    assert f"#{earlier.pk}" in section and "healthy again" in section
    assert "another node's" not in section
    assert "propose a" not in section  # one open repair per node
    assert "js/repairs." in text


def test_operators_see_a_propose_form_and_viewers_do_not(client_for, operator, viewer, node):
    assert propose_url(node) in client_for(operator).get(page(node)).text
    text = client_for(viewer).get(page(node)).text
    assert "No repair open on this node." in text and propose_url(node) not in text


def test_an_operator_proposes_a_repair(client_for, operator, node):
    do_record_health_event(node, signature="thermal_throttle", severity="warning")
    response = client_for(operator).post(
        propose_url(node), {"action": "reprovision", "reason": "thermal paste"},
        HTTP_HX_REQUEST="true")

    assert response.status_code == 200
    repair = Repair.objects.get()
    assert (repair.action, repair.status, repair.requested_by) == ("reprovision",
                                                                   Status.PROPOSED, operator)
    assert repair.reason == "proposed by alice: thermal paste"
    assert list(repair.events.values_list("signature", flat=True)) == ["thermal_throttle"]
    text = response.text.lstrip()
    assert text.startswith('<section class="panel" id="node-repairs"')
    assert f"Repair #{repair.pk} (reprovision) proposed; it waits for an operator" in text
    assert ">Approve</button>" in text
    assert "repair-changed" in json.loads(response["HX-Trigger"])
    assert AuditEntry.objects.get().action == "repair.propose"


def test_a_plain_form_goes_back_to_the_node_page(client_for, operator, node):
    response = client_for(operator).post(propose_url(node),
                                         {"action": "reboot", "reason": "flaky NIC"})
    assert response.status_code == 302 and response["Location"] == page(node)
    assert Repair.objects.get().action == "reboot"


def test_a_second_open_repair_is_refused_with_a_clear_message(client_for, operator, node):
    repair = RepairFactory(node=node)
    response = client_for(operator).post(propose_url(node),
                                         {"action": "remove", "reason": "RMA"}, follow=True)
    assert (f"Not proposed: gpu-017 already has repair #{repair.pk} (reboot, proposed)."
            in [str(m) for m in response.context["messages"]])
    assert Repair.objects.count() == 1


def test_a_proposal_needs_an_action_and_a_reason(client_for, operator, node):
    response = client_for(operator).post(propose_url(node), {"action": "reboot"},
                                         HTTP_HX_REQUEST="true")
    assert "A proposed repair needs an action and a reason." in response.text
    assert not Repair.objects.exists()


def test_proposing_refuses_get_viewers_and_users_without_a_role(client_for, operator, viewer,
                                                                 outsider, node):
    data = {"action": "reboot", "reason": "x"}
    assert client_for(operator).get(propose_url(node)).status_code == 405
    assert client_for(viewer).post(propose_url(node), data).status_code == 403
    assert client_for(outsider).post(propose_url(node), data).status_code == 403
    assert client_for(operator).post(
        reverse("repairs:propose", args=[node.cluster.slug, "gpu-999"]), data).status_code == 404
    assert not Repair.objects.exists()


def test_the_section_alone_is_what_the_page_refetches(client_for, operator, outsider, node):
    repair = RepairFactory(node=node, status=Status.APPROVED)
    url = reverse("repairs:node", args=[node.cluster.slug, node.name])
    response = client_for(operator).get(url, HTTP_HX_REQUEST="true",
                                        HTTP_HX_CURRENT_URL=f"http://testserver{page(node)}")
    text = response.text.strip()
    assert text.startswith('<section class="panel" id="node-repairs"')
    assert f'data-repairs-fetch="{url}"' in text
    assert f'id="repair-{repair.public_id}"' in text
    # Its cancel form, sent without JavaScript, comes back to the node page.
    assert f'name="next" value="{page(node)}"' in text
    # Opened directly (a bookmark), the section is the node's page, where it is.
    assert client_for(operator).get(url).url == page(node)
    assert client_for(outsider).get(url).status_code == 403
