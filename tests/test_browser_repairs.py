"""In Chromium: one-click approve on the Repair tab. An operator has the tab of a cluster open;
gpu-017 has an open Xid 79 on GPU 3; the system recommends a reboot while the page is open and
the recommendation appears without a reload; one click on Approve moves it to Running, with
its steps, without a reload.

No Celery worker runs here: the approved repair stays at its first step, which is all this
test looks at (the steps themselves are the integration tests' business)."""

import time
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import expect

from clusters.roles import Role
from clusters.tests.factories import ClusterFactory, UserFactory
from healthchecks.services import do_record_health_event
from nodes.tests.factories import GpuFactory, NodeFactory
from repairs.choices import Status
from repairs.models import Repair
from repairs.services import refresh_recommendation

from .browser import assert_no_csp_violations, in_a_thread, screenshot, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.integration,
              pytest.mark.django_db(transaction=True)]

MARKER = "set before the recommendation"


def wait_until(page, condition, timeout_s=15):
    """Let the page run until `condition()` holds (Playwright's callbacks run meanwhile)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        page.wait_for_timeout(100)


def quiet_count(page, items, quiet_ms=3000):
    """len(items) once it has stayed the same for `quiet_ms` (repairs.js fetches at most once
    a second, so a refresh it had scheduled has happened by then, even on a slow machine)."""
    while True:
        count = len(items)
        page.wait_for_timeout(quiet_ms)
        if len(items) == count:
            return count


def open_xid_79(node):
    gpu = GpuFactory(node=node, index=3)
    do_record_health_event(node, signature="xid:79", severity="critical", gpu=gpu,
                           message="GPU has fallen off the bus")


def test_a_recommendation_appears_live_and_one_click_approves_it(page, console):
    cluster = ClusterFactory(name="repair-h200", slug="repair-h200")
    UserFactory(username="alice", role=Role.OPERATOR)
    node = NodeFactory(cluster=cluster, name="gpu-017")
    in_a_thread(open_xid_79, node)
    tab = f"/c/{cluster.slug}/repair/"
    # What the tab fetched, and which typed messages its live socket brought.
    fragments, socket_messages = [], []
    page.on("requestfinished", lambda request: fragments.append(request.url)
            if request.headers.get("hx-request") and request.method == "GET" else None)
    page.on("websocket", lambda socket: socket.on(
        "framereceived", lambda frame: socket_messages.append(frame)
        if isinstance(frame, str) and '"type"' in frame else None))
    page.add_init_script(
        "document.addEventListener('DOMContentLoaded', () => document.body.addEventListener("
        "'cluster-changed', () => { window.clusterChanges = (window.clusterChanges || 0) + 1; "
        "}));")

    page.goto(tab)
    sign_in(page, "alice", "password")
    assert urlsplit(page.url).path == tab
    page.wait_for_load_state("load")
    expect(page.locator("body")).to_have_attribute("data-live", "on")
    expect(page.locator("#repair-awaiting")).to_contain_text("No repair awaits approval")
    # The socket opening and its first summary count as changes (live.js): the tab refreshes.
    # Let that be over, so that what follows can only come from "repair.changed".
    # Read through page.evaluate (DevTools), not wait_for_function: the page's CSP forbids eval.
    wait_until(page, lambda: page.evaluate("window.clusterChanges || 0") >= 1)
    wait_until(page, lambda: fragments)
    refreshes_before = quiet_count(page, fragments)

    # Anything that reloads the page or navigates away loses this, and counts a navigation.
    page.evaluate(f"window.repairTestMarker = {MARKER!r}")
    navigations = []
    page.on("framenavigated",
            lambda frame: navigations.append(frame.url) if frame == page.main_frame else None)

    # Only "repair.changed" tells the page: a recommendation changes no node's state.
    repair = in_a_thread(refresh_recommendation, node)
    card = page.locator(f"#repair-{repair.public_id}")
    expect(page.locator("#repair-awaiting").locator(card)).to_be_visible()
    expect(card).to_contain_text("gpu-017")
    expect(card).to_contain_text("GPU 3")
    expect(card).to_contain_text("xid:79")
    expect(card).to_contain_text("reboot in place; local data is kept")
    expect(card).to_contain_text("No scheduler configured")
    assert any('"repair.changed"' in message for message in socket_messages), socket_messages
    assert page.evaluate("window.clusterChanges") == 1  # no node changed state meanwhile
    assert len(fragments) == refreshes_before + 1
    screenshot(page, "repairs-live-recommendation")

    card.get_by_role("button", name="Approve").click()

    running = page.locator("#repair-running").locator(f"#repair-{repair.public_id}")
    expect(running).to_be_visible()
    expect(running).to_contain_text("approved by alice")
    expect(running.locator(".steps li")).to_have_count(6)
    expect(running.locator(".steps li").first).to_contain_text("drain")
    expect(page.locator("#repair-awaiting")).to_contain_text("No repair awaits approval")
    expect(page.locator("#messages")).to_contain_text(f"Repair #{repair.pk} approved")
    repair = Repair.objects.select_related("reviewed_by").get(pk=repair.pk)
    assert repair.status == Status.RUNNING and repair.reviewed_by.username == "alice"

    assert page.evaluate("window.repairTestMarker") == MARKER
    assert navigations == []
    assert urlsplit(page.url).path == tab
    path = screenshot(page, "repairs-approved-running")
    print(f"screenshot: {path}")
    assert not console.errors, str(console)
    assert_no_csp_violations(console)


def test_the_card_lists_a_multi_node_job_once_with_its_nodes_and_records_what_was_approved(
        page, console, slurm):
    """Real Slurm: a 3-node job (gpu-001..003) and a 1-node job (gpu-003) run. An Xid 79 on
    gpu-003 gives a card that lists the 3-node job once, with its 3 nodes, user, account,
    GPUs, running since and GPU-hours, the 1-node job, and the blast radius line. Approving
    records what the approver saw, and the repair's page shows it."""
    from clusters.models import Cluster

    cluster = ClusterFactory(name="slurm-h200", slug="slurm-h200")
    Cluster.objects.filter(pk=cluster.pk).update(scheduler="slurm",
                                                 scheduler_config=str(slurm.slurm_conf))
    UserFactory(username="alice", role=Role.OPERATOR)
    for name in ("gpu-001", "gpu-002", "gpu-004", "gpu-005", "gpu-006", "gpu-007",
                 "gpu-008", "gpu-009", "gpu-010"):
        NodeFactory(cluster=cluster, name=name)
    node = NodeFactory(cluster=cluster, name="gpu-003")
    slurm.add_user("kai", "research")
    slurm.add_user("lena", "infra")
    big = slurm.sbatch("sleep 600", user="kai", account="research", gres="gpu:4",
                       name="llama-70b", nodelist="gpu-001,gpu-002,gpu-003",
                       extra=["--nodes=3"])
    small = slurm.sbatch("sleep 600", user="lena", account="infra", gres="gpu:2",
                         name="eval", nodelist="gpu-003")
    slurm.wait_job_state(big, "RUNNING")
    slurm.wait_job_state(small, "RUNNING")
    in_a_thread(open_xid_79, node)
    repair = in_a_thread(refresh_recommendation, node)

    page.goto(f"/c/{cluster.slug}/repair/")
    sign_in(page, "alice", "password")
    card = page.locator(f"#repair-{repair.public_id}")
    expect(card).to_contain_text("2 jobs stop on 3 nodes (gpu-001, gpu-002, gpu-003)")
    rows = card.locator("table.jobs tbody tr")
    expect(rows).to_have_count(2)  # the 3-node job once
    big_row = card.locator("table.jobs tbody tr", has_text="llama-70b")
    for text in (big, "kai", "research", "12", "gpu-001, gpu-002", "(3 nodes)"):
        expect(big_row).to_contain_text(text)
    expect(card.locator("table.jobs tbody tr", has_text="eval")).to_contain_text("lena")
    expect(card).to_contain_text(
        "Blast radius: 1 of 10 nodes out of service after it; limit 10 % (1 node)")
    expect(card).to_contain_text("Why: NVIDIA: restart the machine (RESTART_BM)")
    screenshot(page, "repair-card-xid79-slurm")

    card.get_by_role("button", name="Approve").click()
    expect(page.locator("#messages")).to_contain_text(f"Repair #{repair.pk} approved")
    stored = Repair.objects.get(pk=repair.pk)
    seen = stored.approval_view
    assert seen["scheduler"] == "slurm" and not seen["error"]
    assert {job["id"]: job["nodes"] for job in seen["jobs"]} == {
        big: ["gpu-001", "gpu-002", "gpu-003"], small: ["gpu-003"]}
    assert {job["id"]: (job["user"], job["account"], job["gpus"]) for job in seen["jobs"]} == {
        big: ("kai", "research", 12), small: ("lena", "infra", 2)}
    assert seen["nodes_hit"] == ["gpu-001", "gpu-002", "gpu-003"]
    assert seen["blast_radius"] == "1 of 10 nodes out of service after it; limit 10 % (1 node)"

    page.goto(f"/c/{cluster.slug}/repair/{repair.public_id}/")
    shown = page.locator(".approval-view")
    expect(shown).to_contain_text("What alice saw when approving")
    expect(shown).to_contain_text("llama-70b")
    expect(shown).to_contain_text("gpu-001, gpu-002, gpu-003")
    screenshot(page, "repair-approval-view")
    assert not console.errors, str(console)
    assert_no_csp_violations(console)
