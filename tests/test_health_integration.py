"""Issue 4's "done when", over real sockets and processes: daphne in production mode, the real
agent (`python -m agent --simulate`) injecting faults through its detectors, and the Health
checks tab read as a viewer.

Each fault's moment is the agent's own log line ("injected xid:79 on GPU 3"); the node's
state change is its NodeTransition row; both clocks are this machine's.
"""

from datetime import datetime, timedelta

import pytest
from django.test import Client
from django.urls import reverse

from clusters.roles import Role
from clusters.tests.factories import ClusterFactory, UserFactory
from healthchecks.models import CheckRun, HealthEvent
from nodes.choices import NodeState
from nodes.models import NodeTransition
from nodes.services import do_issue_join_token

from .integration import wait_until
from .test_live_integration import joined_node

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

THROTTLE_HOLD_S = 3.0


@pytest.fixture
def stack(processes):
    processes.env.update(CLUSTERUI_BOOT_WINDOW_S="0")
    return processes


def injected_at(agent, what):
    """When the agent logged `injected <what>`, or None before it has."""
    for line in agent.log_text().splitlines():
        if line.endswith(f"injected {what}"):
            return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").astimezone()
    return None


def transition_to(node, state, after):
    return NodeTransition.objects.filter(node=node, to_state=state, at__gte=after).first()


def wait_for_transition(node, state, after, agent):
    def found():
        agent.check_running()
        return transition_to(node, state, after)

    return wait_until(found, timeout=30, what=f"{node.name} turns {state}")


def test_injected_faults_show_in_the_tab_and_turn_their_nodes_unhealthy_in_time(stack):
    cluster = ClusterFactory(name="int-health", slug="int-health")
    _, join_token = do_issue_join_token(cluster)
    server = stack.daphne()
    agents = {
        "xid:79 on GPU 3": stack.agent("gpu-001", server, token=join_token,
                                       inject="xid:79@5s:gpu3"),
        "gpu_lost on GPU 2": stack.agent("gpu-002", server, token=join_token,
                                         inject="gpu_lost@5s:gpu2"),
        "thermal on GPU 5": stack.agent("gpu-003", server, token=join_token,
                                        inject="thermal@5s+6s:gpu5",
                                        extra_args=["--throttle-hold", str(THROTTLE_HOLD_S)]),
    }
    nodes = {what: joined_node(cluster, agent.node_name, agent=agent)
             for what, agent in agents.items()}
    started = min(node.last_hello_at for node in nodes.values())

    # 4 s: detection, the frame and the state change, with room for a busy 2-core machine.
    for what, allowed_s in (("xid:79 on GPU 3", 4.0), ("gpu_lost on GPU 2", 4.0),
                            ("thermal on GPU 5", THROTTLE_HOLD_S + 4.0)):
        agent, node = agents[what], nodes[what]
        unhealthy = wait_for_transition(node, NodeState.UNHEALTHY, started, agent)
        fault = injected_at(agent, what)
        assert fault is not None, agent.log_tail()
        delay = (unhealthy.at - fault).total_seconds()
        assert 0 <= delay < allowed_s, f"{what}: unhealthy {delay:.2f} s after the fault"

    # Clearing the held fault heals its node.
    hot_agent, hot_node = agents["thermal on GPU 5"], nodes["thermal on GPU 5"]
    healthy = wait_for_transition(hot_node, NodeState.HEALTHY, started + timedelta(seconds=1),
                                  hot_agent)
    ended = injected_at(hot_agent, "thermal on GPU 5 ended")
    assert ended is not None and 0 <= (healthy.at - ended).total_seconds() < 4.0
    thermal = HealthEvent.objects.get(node=hot_node, signature="thermal_throttle")
    assert thermal.closed_reason == "cleared by the agent" and thermal.gpu.index == 5

    # The tab shows each with the catalog's view; the lost GPU and the Xid stay open.
    viewer = UserFactory(username="int-vera", role=Role.VIEWER)
    client = Client()
    client.force_login(viewer)
    tab = client.get(reverse("healthchecks:list", args=[cluster.slug])).text  # open ones
    assert "xid:79" in tab and "gpu_lost" in tab and "thermal_throttle" not in tab
    tab = client.get(reverse("healthchecks:list", args=[cluster.slug]) + "?open=any").text
    for signature in ("xid:79", "gpu_lost", "thermal_throttle"):
        assert signature in tab
    assert "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS" in tab
    assert "NVRM: Xid (PCI:" in tab  # the kernel line, as evidence
    assert HealthEvent.objects.open().filter(signature__in=["xid:79", "gpu_lost"]).count() == 2
    for agent in agents.values():
        agent.check_running()


def test_a_check_asked_in_the_console_runs_on_the_live_agent_and_its_result_shows(stack):
    """The request is made in this process: on commit it reaches the daphne that holds the
    agent's connection through the shared Redis channel layer."""
    cluster = ClusterFactory(name="int-checks", slug="int-checks")
    _, join_token = do_issue_join_token(cluster)
    server = stack.daphne()
    agent = stack.agent("gpu-001", server, token=join_token, inject="thermal@1s:gpu6")
    node = joined_node(cluster, "gpu-001", agent=agent)
    operator = UserFactory(username="int-alice", role=Role.OPERATOR)
    client = Client()
    client.force_login(operator)

    response = client.post(reverse("healthchecks:run", args=[cluster.slug]),
                           {"node": "gpu-001", "check": "gpu_compute"})
    assert response.status_code == 302
    run = wait_until(
        lambda: CheckRun.objects.filter(node=node).exclude(status__in=CheckRun.UNFINISHED).first(),
        timeout=60, what="the check's result")
    assert run.status == CheckRun.Status.FAILED, run.message
    assert "GPU 6" in run.message and run.metrics["simulated"] is True
    assert run.sent_at is not None and run.requested_by == operator
    event = HealthEvent.objects.get(node=node, signature="check:gpu_compute")
    assert event.source == "active" and event.is_open
    page = client.get(reverse("nodes:detail", args=[cluster.slug, "gpu-001"])).text
    assert "gpu_compute" in page and "run-failed" in page
    agent.check_running()
