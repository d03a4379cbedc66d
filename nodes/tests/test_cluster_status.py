"""The cluster's status from its nodes and maintenance windows, written where they change."""

from datetime import timedelta

import pytest
from django.utils import timezone

from clusters.models import Cluster, ClusterTransition
from nodes.choices import NodeState
from nodes.cluster_status import read_cluster_facts, refresh_cluster_statuses
from nodes.services import (
    do_create_maintenance_window,
    do_end_maintenance_window,
    do_pause_node,
    do_remove_node,
)
from nodes.states import refresh_due_node_states, refresh_node_state

from .factories import NodeFactory

Status = Cluster.Status


def status_of(cluster):
    cluster.refresh_from_db()
    return cluster.status, cluster.status_reason


def timeline(cluster):
    return list(ClusterTransition.objects.filter(cluster=cluster).order_by("at", "pk")
                .values_list("from_status", "to_status"))


@pytest.mark.django_db(transaction=True)  # written once the node's change commits
def test_a_new_cluster_is_provisioning_until_a_node_joins(cluster):
    registered = NodeFactory(cluster=cluster, state=NodeState.PENDING, last_hello_at=None)
    refresh_cluster_statuses([cluster.pk])
    assert status_of(cluster) == (Status.PROVISIONING, "no node has joined yet (1 registered)")

    registered.last_hello_at = timezone.now()
    registered.save()
    refresh_node_state(registered)  # pending -> healthy: the node's change refreshes the cluster

    assert status_of(cluster) == (Status.READY, "")
    assert timeline(cluster) == [(Status.PROVISIONING, Status.READY)]


@pytest.mark.django_db(transaction=True)  # written once the node's change commits
def test_acceptance_holds_the_cluster_until_every_joined_node_passed_or_was_paused(
        cluster, operator):
    cluster.acceptance_tests_enabled = True
    cluster.save()
    passed, failing = (NodeFactory(cluster=cluster, acceptance_required=True) for _ in range(2))
    passed.acceptance_passed_at = passed.joined_at + timedelta(minutes=3)
    passed.save()
    NodeFactory(cluster=cluster, acceptance_required=True, last_hello_at=None)  # not joined
    for node in (passed, failing):
        refresh_node_state(node)

    assert status_of(cluster) == (Status.ACCEPTING, "1 of 2 joined nodes passed acceptance")

    # A node that fails its battery holds the cluster until an operator pauses it (or it
    # passes, or is removed); a paused node is out of service, so the cluster is degraded.
    do_pause_node(failing, actor=operator, reason="failed its battery: RMA")
    assert status_of(cluster)[0] == Status.DEGRADED
    assert timeline(cluster)[-1] == (Status.ACCEPTING, Status.DEGRADED)


@pytest.mark.django_db
def test_a_reprovisioned_node_must_pass_again(cluster):
    cluster.acceptance_tests_enabled = True
    cluster.save()
    node = NodeFactory(cluster=cluster, acceptance_required=True)
    node.acceptance_passed_at = node.joined_at - timedelta(days=1)  # passed before it rejoined
    node.save()
    refresh_cluster_statuses([cluster.pk])
    assert status_of(cluster)[0] == Status.ACCEPTING


@pytest.mark.django_db
def test_an_open_ended_whole_cluster_window_pauses_it_and_ending_it_resumes(cluster, admin):
    NodeFactory(cluster=cluster)
    refresh_cluster_statuses([cluster.pk])
    now = timezone.now()
    # Neither a window with an end nor one over some nodes pauses the cluster.
    do_create_maintenance_window(cluster, reason="firmware", starts_at=now,
                                 ends_at=now + timedelta(hours=2), actor=admin)
    do_create_maintenance_window(cluster, reason="one rack", starts_at=now,
                                 nodes=list(cluster.nodes.all()), actor=admin)
    assert status_of(cluster)[0] == Status.READY

    window = do_create_maintenance_window(cluster, reason="datacenter move", starts_at=now,
                                          actor=admin)
    assert status_of(cluster) == (Status.PAUSED, "maintenance: datacenter move")
    transition = ClusterTransition.objects.filter(cluster=cluster).latest("at")
    assert transition.actor_name == "ada"

    do_end_maintenance_window(window, actor=admin)
    assert status_of(cluster)[0] == Status.READY
    assert timeline(cluster) == [(Status.PROVISIONING, Status.READY),
                                 (Status.READY, Status.PAUSED), (Status.PAUSED, Status.READY)]


@pytest.mark.django_db
def test_a_window_that_starts_later_pauses_the_cluster_on_the_beats_refresh(cluster, admin):
    NodeFactory(cluster=cluster)
    now = timezone.now()
    do_create_maintenance_window(cluster, reason="power work", starts_at=now + timedelta(minutes=5),
                                 actor=admin)
    assert status_of(cluster)[0] == Status.READY

    refresh_due_node_states(now=now + timedelta(minutes=6))
    assert status_of(cluster)[0] == Status.PAUSED


@pytest.mark.django_db(transaction=True)  # written once the node's change commits
def test_degraded_follows_the_threshold_and_removing_nodes_refreshes_it(cluster, operator, admin):
    nodes = [NodeFactory(cluster=cluster) for _ in range(5)]
    do_pause_node(nodes[0], actor=operator, reason="cabling")
    assert status_of(cluster) == (Status.DEGRADED,
                                  "1 of 5 nodes out of service, over the 10 % threshold")

    do_remove_node(nodes[0], actor=admin, reason="decommissioned")
    assert status_of(cluster)[0] == Status.READY


@pytest.mark.django_db
def test_facts_for_many_clusters_in_two_queries(django_assert_num_queries, cluster):
    for _ in range(3):
        NodeFactory(cluster=cluster)
    other = NodeFactory(last_hello_at=None).cluster
    with django_assert_num_queries(2):
        facts = read_cluster_facts()
    assert facts[cluster.pk].joined == 3 and facts[other.pk].joined == 0
    assert facts[other.pk].nodes == 1


@pytest.mark.django_db
def test_a_refresh_that_changes_nothing_writes_nothing(cluster, django_assert_num_queries):
    NodeFactory(cluster=cluster)
    refresh_cluster_statuses([cluster.pk])
    with django_assert_num_queries(3):  # the facts (2) and the cluster's status (1)
        assert refresh_cluster_statuses([cluster.pk]) == set()
    assert len(timeline(cluster)) == 1


@pytest.mark.django_db(transaction=True)  # written once the node's change commits
def test_a_first_hello_that_leaves_the_node_pending_makes_the_cluster_accepting(cluster):
    from nodes.services import do_record_hello, do_register_node

    cluster.acceptance_tests_enabled = True
    cluster.save()
    node = do_register_node(cluster, "gpu-001")
    assert status_of(cluster)[0] == Status.PROVISIONING

    do_record_hello(node, boot_id="4f1c6d2e-0b1a-4c55-9e1e-6f3b2a1d0c9e")

    assert status_of(cluster) == (Status.ACCEPTING, "0 of 1 joined nodes passed acceptance")
    assert timeline(cluster) == [(Status.PROVISIONING, Status.ACCEPTING)]
