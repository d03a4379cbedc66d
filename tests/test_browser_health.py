"""In Chromium: the Health checks tab moves live. An operator has the tab of a cluster open; a
real agent joins and its simulated GPU 3 logs Xid 79; the event appears in the table and in
the counts by signature without a reload, and one click acknowledges it."""

from urllib.parse import urlsplit

import pytest
from playwright.sync_api import expect

from clusters.roles import Role
from clusters.tests.factories import ClusterFactory, UserFactory
from healthchecks.models import HealthEvent
from nodes.services import do_issue_join_token

from .browser import assert_no_csp_violations, screenshot, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.integration,
              pytest.mark.django_db(transaction=True)]

MARKER = "set before the Xid"


def test_an_xid_appears_in_the_open_tab_and_one_click_acknowledges_it(page, console,
                                                                      daphne_server, processes):
    cluster = ClusterFactory(name="health-h200", slug="health-h200")
    _, join_token = do_issue_join_token(cluster)
    UserFactory(username="alice", role=Role.OPERATOR)
    tab = f"/c/{cluster.slug}/health/"

    page.goto(tab)
    sign_in(page, "alice", "password")
    assert urlsplit(page.url).path == tab
    page.wait_for_load_state("load")
    expect(page.locator("body")).to_have_attribute("data-live", "on")
    expect(page.locator("#event-table")).to_contain_text("No health events")
    expect(page.locator("#signature-counts")).to_contain_text("No open health events")

    # Anything that reloads the page or navigates away loses this, and counts a navigation.
    page.evaluate(f"window.healthTestMarker = {MARKER!r}")
    navigations = []
    page.on("framenavigated",
            lambda frame: navigations.append(frame.url) if frame == page.main_frame else None)

    # The agent joins in about a second; the Xid comes from its kernel-log watcher after 4 s.
    processes.agent("gpu-001", daphne_server, token=join_token, inject="xid:79@4s:gpu3")
    row = page.locator("#event-table tbody tr", has_text="xid:79")
    expect(row).to_be_visible(timeout=30_000)
    expect(row).to_contain_text("gpu-001")
    expect(row).to_contain_text("GPU 3")
    expect(page.locator("#signature-counts")).to_contain_text("xid:79")
    expect(page.locator("#signature-counts")).to_contain_text("on 1 node")
    screenshot(page, "health-live-xid")

    # The row's actions are behind one menu.
    expect(row.get_by_role("button", name="Acknowledge")).to_have_count(0)
    row.locator("summary", has_text="Actions").click()
    row.get_by_role("button", name="Acknowledge").click()
    expect(row).to_contain_text("acknowledged by alice")
    expect(row.get_by_role("button", name="Acknowledge")).to_have_count(0)
    event = HealthEvent.objects.select_related("acknowledged_by").get(
        node__cluster=cluster, signature="xid:79")
    assert event.acknowledged_by.username == "alice" and event.is_open

    assert page.evaluate("window.healthTestMarker") == MARKER
    assert navigations == []
    assert urlsplit(page.url).path == tab
    path = screenshot(page, "health-live-acknowledged")
    print(f"screenshot: {path}")
    assert not console.errors, str(console)
    assert_no_csp_violations(console)
