"""In Chromium: the node page's hygiene panel. A real agent on simulated GPUs (its node
hygiene simulated too: agent/sim/hygiene.py) joins, and 2 s later 25 zombies appear
under one parent; the panel shows them without a reload, one click on "Clean up processes"
has the agent reap them, and the panel shows its answer and the zombies gone."""

import pytest
from playwright.sync_api import expect

from clusters.roles import Role
from clusters.tests.factories import ClusterFactory, UserFactory
from nodes.models import AgentCommand
from nodes.services import do_issue_join_token

from .browser import assert_no_csp_violations, screenshot, sign_in
from .test_live_integration import joined_node

pytestmark = [pytest.mark.browser, pytest.mark.integration,
              pytest.mark.django_db(transaction=True)]


def test_zombies_show_live_and_one_click_cleans_them_up(page, console, daphne_server,
                                                        processes):
    cluster = ClusterFactory(name="hygiene-h200", slug="hygiene-h200")
    _, join_token = do_issue_join_token(cluster)
    UserFactory(username="alice", role=Role.OPERATOR)
    agent = processes.agent("gpu-001", daphne_server, token=join_token, inject="zombies@2s")
    joined_node(cluster, "gpu-001", agent=agent)

    page.goto(f"/c/{cluster.slug}/nodes/gpu-001/")
    sign_in(page, "alice", "password")
    panel = page.locator("#node-hygiene")
    # The page may come before the agent's first sample: the panel appears when it does.
    expect(panel.locator("#slurmd-status")).to_contain_text("running", timeout=30_000)
    zombies = panel.locator("#process-status dd").first
    expect(zombies).to_contain_text("25", timeout=30_000)  # the panel polls: no reload
    expect(zombies).to_contain_text("zombie_processes")
    screenshot(page, "node-hygiene-zombies")

    navigations = []
    page.on("framenavigated",
            lambda frame: navigations.append(frame.url) if frame == page.main_frame else None)
    panel.get_by_role("button", name="Clean up processes").click()
    expect(page.locator("#cleanup-result")).to_contain_text(
        "ok: ended 0 orphaned processes (0 with SIGKILL); signalled 1 parent of 25 zombies",
        timeout=30_000)
    expect(zombies).to_have_text("0", timeout=30_000)
    command = AgentCommand.objects.get(node__name="gpu-001", action="cleanup")
    assert command.requested_by.username == "alice" and command.status == "ok"
    assert navigations == []
    screenshot(page, "node-hygiene-cleaned")
    assert not console.errors, str(console)
    assert_no_csp_violations(console)
