from datetime import timedelta

import pytest
from django.utils import timezone

from nodes.choices import NodeState
from nodes.models import NodeTransition
from nodes.states import NodeFacts, compute_state, refresh_due_node_states, refresh_node_state

from .factories import NodeFactory

EVERYTHING = dict(
    paused=True, paused_reason="paused by alice: maintenance", running_repair="repair #12 (reboot)",
    ever_connected=False, acceptance_pending=True, boot_window_open=True, boot_tasks_running=True,
    worst_open_problem="xid:79 on GPU 3",
)


@pytest.mark.parametrize(
    "facts, state",
    [
        # DESIGN.md's precedence: the first row that holds wins, whatever holds below it.
        (EVERYTHING, NodeState.PAUSED),
        ({**EVERYTHING, "paused": False}, NodeState.PAUSED),  # a running repair
        ({**EVERYTHING, "paused": False, "running_repair": ""}, NodeState.PENDING),
        ({**EVERYTHING, "paused": False, "running_repair": "", "ever_connected": True},
         NodeState.PENDING),  # acceptance tests not passed
        (dict(ever_connected=True, boot_window_open=True, boot_tasks_running=True,
              worst_open_problem="xid:79"), NodeState.BOOTING),
        (dict(ever_connected=True, boot_tasks_running=True, worst_open_problem="xid:79"),
         NodeState.BOOTING),
        (dict(ever_connected=True, worst_open_problem="xid:79 on GPU 3"), NodeState.UNHEALTHY),
        (dict(ever_connected=True), NodeState.HEALTHY),
        (dict(), NodeState.PENDING),
    ],
)
def test_it_applies_the_precedence_table(facts, state):
    assert compute_state(NodeFacts(**facts))[0] == state


def test_the_reason_says_why():
    assert compute_state(NodeFacts(paused=True, paused_reason="paused by alice: bios")) == (
        NodeState.PAUSED, "paused by alice: bios")
    assert compute_state(NodeFacts(running_repair="repair #12 (reboot)"))[1] == "repair #12 (reboot)"
    assert compute_state(NodeFacts(ever_connected=True, worst_open_problem="xid:79 on GPU 3")) == (
        NodeState.UNHEALTHY, "xid:79 on GPU 3")
    assert compute_state(NodeFacts(ever_connected=True)) == (NodeState.HEALTHY, "")


@pytest.mark.django_db
def test_refresh_writes_the_state_and_one_transition_only_on_change(operator):
    node = NodeFactory(state=NodeState.HEALTHY, booted_at=None)
    node.paused, node.paused_reason = True, "paused by alice: cabling"
    node.save()

    assert refresh_node_state(node, actor=operator) is True
    assert refresh_node_state(node, actor=operator) is False

    node.refresh_from_db()
    assert node.state == NodeState.PAUSED
    assert node.state_reason == "paused by alice: cabling"
    (transition,) = NodeTransition.objects.filter(node=node)
    assert (transition.from_state, transition.to_state) == (NodeState.HEALTHY, NodeState.PAUSED)
    assert transition.actor == operator and transition.actor_name == "alice"
    assert transition.cluster_id == node.cluster_id


@pytest.mark.django_db
def test_acceptance_tests_hold_a_node_pending_until_they_pass_since_it_joined():
    node = NodeFactory(state=NodeState.HEALTHY, acceptance_required=True)
    refresh_node_state(node)
    node.refresh_from_db()
    assert node.state == NodeState.PENDING

    node.acceptance_passed_at = node.joined_at + timedelta(minutes=5)
    node.save()
    refresh_node_state(node)
    node.refresh_from_db()
    assert node.state == NodeState.HEALTHY


@pytest.mark.django_db
def test_the_boot_window_ends_on_the_periodic_refresh(settings):
    settings.CLUSTERUI_BOOT_WINDOW_S = 120
    now = timezone.now()
    node = NodeFactory(state="", booted_at=now - timedelta(seconds=60))
    refresh_node_state(node, now=now)
    node.refresh_from_db()
    assert node.state == NodeState.BOOTING

    assert refresh_due_node_states(now=now + timedelta(seconds=30)) == 0
    assert refresh_due_node_states(now=now + timedelta(seconds=61)) == 1
    node.refresh_from_db()
    assert node.state == NodeState.HEALTHY
    assert node.transitions.first().reason == "boot window ended"


@pytest.mark.django_db
def test_boot_tasks_keep_a_node_booting_past_its_window(settings):
    now = timezone.now()
    node = NodeFactory(state=NodeState.BOOTING, booted_at=now - timedelta(hours=1),
                       boot_tasks_running=True)
    assert refresh_due_node_states(now=now) == 0
    node.refresh_from_db()
    assert node.state == NodeState.BOOTING
