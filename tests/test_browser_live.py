"""In Chromium: the overview moves live. A viewer has the overview of an empty cluster open;
a real agent joins; the page's numbers change over its live socket, without a reload."""

from urllib.parse import urlsplit

import pytest
from playwright.sync_api import expect

from clusters.roles import Role
from clusters.tests.factories import ClusterFactory, UserFactory
from nodes.choices import NodeState
from nodes.models import Node
from nodes.services import do_issue_join_token, do_pause_node, do_resume_node

from .browser import assert_no_csp_violations, screenshot, sign_in
from .integration import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.integration,
              pytest.mark.django_db(transaction=True)]

MARKER = "set before the agent joined"


def text(page, selector):
    return page.locator(selector).inner_text().strip()


def test_the_overview_counts_a_joining_node_without_a_reload(page, console, daphne_server,
                                                            processes):
    cluster = ClusterFactory(name="live-h200", slug="live-h200")
    _, join_token = do_issue_join_token(cluster)
    UserFactory(username="vera", role=Role.VIEWER)
    overview = f"/c/{cluster.slug}/"

    page.goto(overview)
    sign_in(page, "vera", "password")
    assert urlsplit(page.url).path == overview
    page.wait_for_load_state("load")
    # The live socket is open before anything happens, and the page starts empty.
    expect(page.locator("body")).to_have_attribute("data-live", "on")
    for state in NodeState:
        assert text(page, f'[data-live-count="{state.value}"]') == "0", state
    # "no" as the server rendered it, "–" once the first (empty) summary came.
    assert text(page, '[data-live-usage="gpus_reporting"]') in ("no", "–")
    assert page.locator('ul.figures[data-live-when="reporting"]').is_hidden()

    # Anything that reloads the page or navigates away loses this, and counts a navigation.
    page.evaluate(f"window.liveTestMarker = {MARKER!r}")
    navigations = []
    page.on("framenavigated",
            lambda frame: navigations.append(frame.url) if frame == page.main_frame else None)

    agent = processes.agent("gpu-001", daphne_server, token=join_token)
    # A node that just said hello for the first time is booting (its boot window is open).
    # (Playwright's expect polls the DOM without eval, which the page's CSP forbids.)
    expect(page.locator('[data-live-count="booting"]')).to_have_text("1", timeout=30_000)
    expect(page.locator('[data-live-usage="gpus_reporting"]')).to_have_text("8", timeout=30_000)
    expect(page.locator('ul.figures[data-live-when="reporting"]')).to_be_visible()
    assert text(page, '[data-live-count="pending"]') == "0"
    assert Node.objects.get(cluster=cluster, name="gpu-001").state == NodeState.BOOTING
    util = text(page, '[data-live-usage="gpu_util_pct"]')
    assert util.endswith(" %") and 0 <= int(util.removesuffix(" %")) <= 100, util

    # One node of one paused: the cluster is degraded (over 10 %), and says so live.
    assert page.locator("#degraded").is_hidden()
    do_pause_node(Node.objects.get(cluster=cluster, name="gpu-001"), actor=None, reason="reseat")
    expect(page.locator("#degraded")).to_be_visible(timeout=10_000)
    expect(page.locator("#degraded")).to_contain_text("Degraded: 1 of 1 nodes")
    # The timeline followed too (htmx refetches it when the summary says it moved): the
    # pause, not the routine registration and first boot it leaves out by default.
    expect(page.locator("table.timeline")).to_contain_text("reseat", timeout=10_000)
    expect(page.locator("table.timeline")).not_to_contain_text("registered")
    do_resume_node(Node.objects.get(cluster=cluster, name="gpu-001"),
                   actor=UserFactory(username="otto", role=Role.OPERATOR))
    expect(page.locator("#degraded")).to_be_hidden(timeout=10_000)

    assert page.evaluate("window.liveTestMarker") == MARKER
    assert navigations == []
    assert urlsplit(page.url).path == overview
    agent.check_running()
    path = screenshot(page, "overview-live")
    print(f"screenshot: {path}")
    assert not console.errors, str(console)
    assert_no_csp_violations(console)


def test_the_usage_chart_of_a_cluster_without_history_shows_the_live_points(
        page, console, daphne_server, processes):
    """A cluster with no per-minute rollups yet: the chart still shows the last hour, and each
    second's summary adds a point to it. Those points must land where the chart is drawn."""
    cluster = ClusterFactory(name="new-h200", slug="new-h200")
    _, join_token = do_issue_join_token(cluster)
    UserFactory(username="vera", role=Role.VIEWER)
    page.goto(f"/c/{cluster.slug}/")
    sign_in(page, "vera", "password")
    expect(page.locator("body")).to_have_attribute("data-live", "on")
    processes.agent("gpu-001", daphne_server, token=join_token)
    expect(page.locator('[data-live-usage="gpus_reporting"]')).to_have_text("8", timeout=30_000)

    # Read through page.evaluate (DevTools), not wait_for_function: the page's CSP forbids eval.
    chart = "document.getElementById('usage-chart')"
    wait_until(lambda: page.evaluate(f"{chart}.data[0].x.length") >= 3, timeout=15,
               what="three live points on the chart", interval=0.2)
    # Plotly's own conversion of the newest point and of the drawn x range to milliseconds.
    newest, start, end = page.evaluate(f"""() => {{
        const ax = {chart}._fullLayout.xaxis;
        return [ax.d2l({chart}.data[0].x.at(-1)), ...ax.range.map(r => ax.r2l(r))];
    }}""")
    screenshot(page, "overview-live-chart")
    assert start <= newest <= end, (
        f"the newest live point is {(newest - end) / 1000:.1f} s past the right end of the "
        f"chart's x range ({(end - start) / 60000:.0f} min wide): not drawn")
    assert_no_csp_violations(console)
