"""Bulk operations from the Nodes tab's list: pause, resume, run a health check."""

import pytest
from django.urls import reverse

from clusters.models import AuditEntry
from healthchecks.models import CheckRun
from nodes.choices import NodeState
from nodes.models import Node
from nodes.services import do_pause_node

from .factories import GpuFactory, NodeFactory

pytestmark = pytest.mark.django_db


def bulk_url(cluster, operation, query=""):
    app = "healthchecks" if operation == "check" else "nodes"  # a check is health's action
    return reverse(f"{app}:bulk_{operation}", args=[cluster.slug]) + query


@pytest.fixture
def nodes(cluster):
    made = [NodeFactory(cluster=cluster, name=f"gpu-{i:03d}") for i in range(1, 8)]
    for node in made:
        GpuFactory(node=node, index=0)
    return made


def test_an_operator_pauses_several_nodes_and_hears_which_were_already_paused(
        client_for, operator, cluster, nodes):
    for node in nodes[5:]:
        do_pause_node(node, actor=None, reason="earlier")

    response = client_for(operator).post(
        bulk_url(cluster, "pause", "?state=healthy"),
        {"nodes": [n.name for n in nodes], "reason": "rack 12 power work"}, follow=True)

    assert response.redirect_chain == [("/c/prod-h200/nodes/?state=healthy", 302)]
    assert "Paused 5 nodes; 2 were already paused." in response.text
    paused = Node.objects.filter(paused=True, paused_reason="paused by alice: rack 12 power work")
    assert sorted(paused.values_list("name", flat=True)) == [n.name for n in nodes[:5]]
    assert set(Node.objects.values_list("state", flat=True)) == {NodeState.PAUSED}
    entries = AuditEntry.objects.filter(action="node.pause", actor_name="alice")
    assert entries.count() == 5


def test_an_operator_resumes_several_nodes(client_for, operator, cluster, nodes):
    for node in nodes[:3]:
        do_pause_node(node, actor=None, reason="earlier")
    client = client_for(operator)

    response = client.post(bulk_url(cluster, "resume"), {"nodes": [n.name for n in nodes[:4]]},
                           follow=True)

    assert "Resumed 3 nodes; 1 was not paused." in response.text
    assert not Node.objects.filter(paused=True).exists()
    assert AuditEntry.objects.filter(action="node.resume").count() == 3


def test_an_operator_runs_a_check_on_several_nodes(client_for, operator, cluster, nodes):
    client = client_for(operator)
    names = [n.name for n in nodes[:3]]

    first = client.post(bulk_url(cluster, "check"), {"nodes": names, "check": "nvml_sanity"},
                        follow=True)
    again = client.post(bulk_url(cluster, "check"),
                        {"nodes": [*names, nodes[3].name], "check": "nvml_sanity"}, follow=True)

    assert "Started nvml_sanity on 3 nodes." in first.text
    assert "Started nvml_sanity on 1 node; 3 were already running it." in again.text
    runs = CheckRun.objects.filter(check_name="nvml_sanity", requested_by__username="alice")
    assert sorted(runs.values_list("node__name", flat=True)) == [n.name for n in nodes[:4]]


def test_a_bulk_pause_needs_a_reason_and_some_nodes(client_for, operator, cluster, nodes):
    client = client_for(operator)
    no_reason = client.post(bulk_url(cluster, "pause"), {"nodes": [nodes[0].name]}, follow=True)
    no_nodes = client.post(bulk_url(cluster, "pause"), {"reason": "x"}, follow=True)
    assert "Say why the nodes are paused." in no_reason.text
    assert "Select some nodes." in no_nodes.text
    assert not Node.objects.filter(paused=True).exists()


def test_a_node_of_another_cluster_is_refused_and_nothing_changes(client_for, operator,
                                                                   cluster, nodes):
    stranger = NodeFactory(name="elsewhere")
    response = client_for(operator).post(
        bulk_url(cluster, "pause"), {"nodes": [nodes[0].name, stranger.name], "reason": "x"},
        follow=True)
    assert "Select a valid choice. elsewhere is not one of the available choices." in response.text
    assert not Node.objects.filter(paused=True).exists()


@pytest.mark.parametrize("operation", ["pause", "resume", "check"])
def test_get_is_not_allowed(client_for, operator, cluster, operation):
    assert client_for(operator).get(bulk_url(cluster, operation)).status_code == 405


@pytest.mark.parametrize("operation", ["pause", "resume", "check"])
def test_a_viewer_is_refused(client_for, viewer, cluster, nodes, operation):
    data = {"nodes": [nodes[0].name], "reason": "x", "check": "nvml_sanity"}
    assert client_for(viewer).post(bulk_url(cluster, operation), data).status_code == 403
    assert not Node.objects.filter(paused=True).exists()
    assert not CheckRun.objects.exists()


def test_an_htmx_bulk_pause_returns_the_table_with_the_same_filters_and_the_message(
        client_for, operator, cluster, nodes):
    response = client_for(operator).post(
        bulk_url(cluster, "pause", "?name=gpu-00&sort=name"),
        {"nodes": [nodes[0].name, nodes[1].name], "reason": "reseat"}, HTTP_HX_REQUEST="true")

    text = response.text.lstrip()
    assert text.startswith('<div id="node-table" hx-get="/c/prod-h200/nodes/?name=gpu-00'
                           '&amp;sort=name&amp;page=1"')
    assert '<div id="messages" class="messages" role="status" hx-swap-oob="true">' in text
    assert "Paused 2 nodes." in text
    assert text.count("badge state-paused") == 2
    assert "<h1>" not in text
