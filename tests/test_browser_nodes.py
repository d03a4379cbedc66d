"""In Chromium: the Nodes tab. The grid shows a tile per node, and a tile opens its node (with
its charts); in the list, "select all" and one click on Pause pause every node of the page
without a reload."""

from urllib.parse import urlsplit

import pytest
from playwright.sync_api import expect

from clusters.roles import Role
from clusters.tests.factories import ClusterFactory, UserFactory
from nodes.choices import NodeState
from nodes.models import Node
from nodes.tests.factories import GpuFactory, NodeFactory

from .browser import assert_no_csp_violations, screenshot, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

STATES = [NodeState.HEALTHY] * 6 + [NodeState.UNHEALTHY] * 2 + [NodeState.PAUSED]


@pytest.fixture
def fleet():
    cluster = ClusterFactory(name="nodes-h200", slug="nodes-h200")
    UserFactory(username="alice", role=Role.OPERATOR)
    nodes = [NodeFactory(cluster=cluster, name=f"gpu-{i:03d}", state=state)
             for i, state in enumerate(STATES, start=1)]
    for node in nodes:
        GpuFactory(node=node, index=0)
    return cluster


def test_the_grid_shows_a_tile_per_node_and_a_tile_opens_its_node(page, console, fleet):
    grid = f"/c/{fleet.slug}/nodes/?view=grid"
    page.goto(grid)
    sign_in(page, "alice", "password")
    assert urlsplit(page.url).path == f"/c/{fleet.slug}/nodes/"

    tiles = page.locator(".node-grid a.tile")
    expect(tiles).to_have_count(len(STATES))
    expect(page.locator(".node-grid a.tile.unhealthy")).to_have_count(2)
    # The grid may be redrawn live meanwhile (a tile detached for a moment has no box).
    expect(tiles.first).to_be_visible()
    box = None
    for _ in range(50):  # a tile swapped out between the two reads has no box: read again
        box = tiles.first.bounding_box()
        if box is not None:
            break
        page.wait_for_timeout(100)
    assert box is not None and box["width"] >= 10 and box["height"] >= 10  # not collapsed
    screenshot(page, "nodes-grid")

    with page.expect_navigation():
        page.locator('.node-grid a.tile[title^="gpu-007 "]').click()
    assert urlsplit(page.url).path == f"/c/{fleet.slug}/nodes/gpu-007/"
    expect(page.locator("h1")).to_contain_text("gpu-007")
    # The charts were drawn by plotly (node_charts.js), one per metric, on fixed axes in
    # units a person reads: memory up to the H200's own 141 GiB, times without the date.
    expect(page.locator("#node-charts-panel .chart .main-svg").first).to_be_visible()
    page.wait_for_function("document.querySelectorAll('#node-charts-panel .chart').length == 5 "
                           "&& [...document.querySelectorAll('#node-charts-panel .chart')]"
                           ".every(el => el.layout)")
    axes = page.evaluate("""Object.fromEntries([...document.querySelectorAll(
        '#node-charts-panel .chart')].map(el => [el.dataset.metric,
        [el.layout.yaxis.range, el.layout.xaxis.tickformat]]))""")
    assert axes == {"util_pct": [[0, 100], "%H:%M"], "sm_active_pct": [[0, 100], "%H:%M"],
                    "mem_used_bytes": [[0, 141], "%H:%M"],
                    "temp_c": [[0, 100], "%H:%M"], "power_w": [[0, 100], "%H:%M"]}
    expect(page.locator("#ssh-command")).to_have_text("ssh alice@gpu-007")
    assert_no_csp_violations(console)


def test_select_all_and_one_click_pause_every_node_of_the_page(page, console, fleet):
    page.goto(f"/c/{fleet.slug}/nodes/?state=healthy")
    sign_in(page, "alice", "password")
    page.wait_for_load_state("load")
    navigations = []
    page.on("framenavigated",
            lambda frame: navigations.append(frame.url) if frame == page.main_frame else None)

    page.locator("#select-all").check()
    expect(page.locator('#node-table input[name="nodes"]:checked')).to_have_count(6)
    page.get_by_label("reason to pause").fill("rack 12 power work")
    page.locator(".bulk-bar").get_by_role("button", name="Pause").click()

    expect(page.locator("#messages")).to_contain_text("Paused 6 nodes.")
    # The table came back with the same filter (healthy): no node is healthy any more.
    expect(page.locator("#node-table")).to_contain_text("No node matches these filters.")
    assert not navigations, navigations
    paused = Node.objects.filter(cluster=fleet, paused=True,
                                 paused_reason="paused by alice: rack 12 power work")
    assert paused.count() == 6
    assert not Node.objects.filter(cluster=fleet, state=NodeState.HEALTHY).exists()
    screenshot(page, "nodes-bulk-pause")
    assert_no_csp_violations(console)


def test_the_grid_names_a_small_fleets_tiles_and_shows_2000_nodes_on_one_screen(page, console):
    """Issue 27: the grid's tiles had no labels. Up to 200 nodes each tile names its node; at
    2,000 nodes the tiles are small again, and one 1440x900 screen shows every one."""
    small = ClusterFactory(name="small-h200", slug="small-h200")
    large = ClusterFactory(name="large-h200", slug="large-h200")
    UserFactory(username="alice", role=Role.OPERATOR)
    for i in range(1, 65):
        NodeFactory(cluster=small, name=f"gpu-{i:03d}")
    Node.objects.bulk_create(NodeFactory.build(cluster=large, name=f"gpu-{i:04d}")
                             for i in range(1, 2001))
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(f"/c/{small.slug}/nodes/?view=grid")
    sign_in(page, "alice", "password")

    label = page.locator('.node-grid.labelled a.tile[title^="gpu-064 "]')
    expect(label).to_have_text("gpu-064")
    box = label.bounding_box()
    text_box = label.locator("span").bounding_box()
    assert text_box["width"] <= box["width"]  # the name fits its tile
    screenshot(page, "nodes-grid-labelled")

    page.goto(f"/c/{large.slug}/nodes/?view=grid")
    tiles = page.locator(".node-grid a.tile")
    expect(tiles).to_have_count(2000)
    assert page.locator(".node-grid.labelled").count() == 0
    last = tiles.last.bounding_box()
    assert last["y"] + last["height"] <= 900, last  # no scrolling to see the last node
    screenshot(page, "nodes-grid-2000")
    assert_no_csp_violations(console)
