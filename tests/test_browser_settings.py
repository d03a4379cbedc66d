"""In Chromium: the cluster settings page as an admin sees it. Its join-tokens table spilled
past its panel (issue 27): seven columns in a panel 720 px wide."""

import pytest
from playwright.sync_api import expect

from clusters.roles import Role
from clusters.tests.factories import ClusterFactory, UserFactory
from nodes.services.tokens import do_issue_join_token

from .browser import assert_no_csp_violations, screenshot, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_join_tokens_table_stays_inside_its_panel(page, console):
    cluster = ClusterFactory(name="settings-h200", slug="settings-h200")
    admin = UserFactory(username="ada", role=Role.ADMIN)
    do_issue_join_token(cluster, actor=admin, single_use=True,
                        note="rack 14 reprovisioning after the PDU swap, batch 2 of 3")
    do_issue_join_token(cluster, actor=admin, note="bring-up")
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(f"/c/{cluster.slug}/settings/")
    sign_in(page, "ada", "password")

    table = page.locator("#join-tokens table")
    expect(table.locator("tbody tr")).to_have_count(2)
    panel = page.locator("#join-tokens").bounding_box()
    box = table.bounding_box()
    assert box["x"] + box["width"] <= panel["x"] + panel["width"], (box, panel)
    widths = page.locator("#join-tokens").evaluate("el => [el.scrollWidth, el.clientWidth]")
    assert widths[0] <= widths[1], widths  # nothing scrolls out of the panel either
    screenshot(page, "settings-join-tokens")
    assert_no_csp_violations(console)
