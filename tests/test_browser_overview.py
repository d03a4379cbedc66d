"""In Chromium: a viewer signs in and reads the overview; a viewer may not create a cluster."""

from datetime import timedelta
from urllib.parse import urlsplit

import pytest
from django.utils import timezone

from clusters.roles import Role
from clusters.tests.factories import ClusterFactory, UserFactory
from nodes.choices import NodeState
from nodes.models import Node
from nodes.tests.factories import NodeFactory, NodeTransitionFactory

from .browser import assert_no_csp_violations, screenshot, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# A different number per state, so a count shown under the wrong state cannot pass.
NODES_PER_STATE = {
    NodeState.HEALTHY: 5,
    NodeState.BOOTING: 1,
    NodeState.UNHEALTHY: 2,
    NodeState.PENDING: 3,
    NodeState.PAUSED: 4,
}


@pytest.fixture
def fleet():
    cluster = ClusterFactory(name="prod-h200", slug="prod-h200")
    nodes = {
        state: [NodeFactory(cluster=cluster, state=state) for _ in range(n)]
        for state, n in NODES_PER_STATE.items()
    }
    now = timezone.now()
    transitions = [
        NodeTransitionFactory(
            node=nodes[NodeState.UNHEALTHY][0], from_state=NodeState.HEALTHY,
            to_state=NodeState.UNHEALTHY, reason="xid:79 on GPU 3",
            at=now - timedelta(minutes=3),
        ),
        NodeTransitionFactory(
            node=nodes[NodeState.PAUSED][0], from_state=NodeState.HEALTHY,
            to_state=NodeState.PAUSED, reason="paused for maintenance", actor_name="alice",
            at=now - timedelta(minutes=2),
        ),
        NodeTransitionFactory(
            node=nodes[NodeState.BOOTING][0], from_state=NodeState.UNHEALTHY,
            to_state=NodeState.BOOTING, reason="rebooted: new boot_id",
            at=now - timedelta(minutes=1),
        ),
    ]
    return cluster, transitions


def test_a_viewer_signs_in_and_sees_the_overview(page, console, fleet):
    cluster, transitions = fleet
    UserFactory(username="vera", role=Role.VIEWER)
    overview = f"/c/{cluster.slug}/"

    page.goto(overview)
    assert urlsplit(page.url).path == "/accounts/login/"
    screenshot(page, "login")
    sign_in(page, "vera", "password")
    assert urlsplit(page.url).path == overview

    for state in NodeState:
        shown = page.locator(f'[data-live-count="{state.value}"]').inner_text()
        in_db = Node.objects.filter(cluster=cluster, state=state).count()
        assert int(shown) == in_db == NODES_PER_STATE[state], state

    rows = page.locator("table.timeline tbody tr")
    assert rows.count() == len(transitions)
    # Newest first: the timeline reads as "what happened" most recent at the top.
    for row, t in zip(rows.all(), reversed(transitions)):
        text = row.inner_text()
        assert t.node.name in text
        assert t.reason in text
        assert t.actor_name in text

    page.wait_for_load_state("load")
    screenshot(page, "overview")
    assert not console.errors, str(console)
    assert_no_csp_violations(console)


NETWORK_AXIS = "document.getElementById('usage-chart').layout.yaxis2"
SUMMARY = """gbps => document.body.dispatchEvent(new CustomEvent("cluster-summary", {detail: {
    at: Date.now() / 1000, counts: {}, usage: {gpu_util_pct: 50, gpu_mem_used_pct: 40,
    net_gbps: gbps}}}))"""


def test_the_network_axis_keeps_round_ticks_and_only_grows(page, fleet):
    cluster, _ = fleet
    UserFactory(username="vera", role=Role.VIEWER)
    page.goto(f"/c/{cluster.slug}/")
    sign_in(page, "vera", "password")
    # plotly.js comes after the page's load event (static/js/plotly_loader.js)
    page.wait_for_function("() => document.getElementById('usage-chart').layout !== undefined")
    assert page.evaluate(f"[{NETWORK_AXIS}.range, {NETWORK_AXIS}.dtick]") == [[0, 1], 0.2]
    page.evaluate(SUMMARY, 38.5)
    assert page.evaluate(f"[{NETWORK_AXIS}.range, {NETWORK_AXIS}.dtick]") == [[0, 50], 10]
    page.evaluate(SUMMARY, 20)  # lower: the axis stays as it was
    page.evaluate(SUMMARY, 45)
    assert page.evaluate(f"[{NETWORK_AXIS}.range, {NETWORK_AXIS}.dtick]") == [[0, 50], 10]
    page.evaluate(SUMMARY, 309)
    assert page.evaluate(f"{NETWORK_AXIS}.range") == [0, 500]


def test_a_viewer_may_not_create_a_cluster(page, console):
    UserFactory(username="vera", role=Role.VIEWER)

    page.goto("/accounts/login/")
    sign_in(page, "vera", "password")
    response = page.goto("/clusters/new/")

    assert response.status == 403
    assert page.locator("h1").inner_text() == "Not allowed"
    screenshot(page, "cluster-create-forbidden")
    assert_no_csp_violations(console)


FIRST_LOAD = """(() => {
    const navigation = performance.getEntriesByType("navigation")[0];
    const plotly = performance.getEntriesByType("resource").find(r => r.name.includes("plotly.min"));
    const paint = performance.getEntriesByName("first-contentful-paint")[0];
    return {first_paint_ms: paint ? Math.round(paint.startTime) : null,
            load_ms: Math.round(navigation.loadEventEnd - navigation.startTime),
            content_ms: Math.round(navigation.domContentLoadedEventEnd - navigation.startTime),
            plotly_bytes: plotly.transferSize, plotly_decoded_bytes: plotly.decodedBodySize};
})()"""


def test_the_overviews_first_load_fetches_plotly_compressed(page, fleet):
    """The first load of the overview in a fresh browser (no cache): plotly.js (4.8 MB) comes
    compressed. The load time is printed for bench/README.md ("First load"), not asserted:
    it is the machine's."""
    cluster, _ = fleet
    UserFactory(username="vera", role=Role.VIEWER)
    page.goto(f"/c/{cluster.slug}/")
    sign_in(page, "vera", "password")  # on to the overview, with nothing cached
    page.wait_for_load_state("load")
    # plotly.js comes after the load event (static/js/plotly_loader.js): the usage chart is
    # drawn when it has run.
    page.wait_for_selector("#usage-chart .main-svg")
    charts_ms = page.evaluate("Math.round(performance.now())")
    first = page.evaluate(FIRST_LOAD)
    print(f"overview first load: {first}, usage chart drawn at {charts_ms} ms")
    assert first["load_ms"] <= charts_ms
    assert first["plotly_decoded_bytes"] > 4_000_000
    assert 0 < first["plotly_bytes"] < 2_000_000
