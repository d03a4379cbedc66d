"""In Chromium, on the embedded mode as `make demo` runs it (SQLite, the in-memory channel
layer, a Celery worker and beat on kombu's SQLAlchemy transport): what a worker changes
reaches the open page and the connected agent through the change feed, which daphne's
publisher reads.

The simulated agent reports Xid 79; the beat's recommender (reading the feed) proposes a
reboot; the operator approves it with one click. Every step then runs in the worker, a
process whose in-memory channel layer reaches no browser and no agent: each step shows in
the open Repair tab within 2 s of the worker finishing it, with no polling in the page's
script; the reboot command and the checks after the reboot, both asked in the worker,
reach the agent's connection.
"""

import json
import shutil
import subprocess
import sys
import time

import pytest
from playwright.sync_api import expect

from .browser import (
    ARTIFACTS,
    REPO_ROOT,
    assert_no_csp_violations,
    screenshot,
    sign_in,
    subprocess_env,
)
from .conftest import chromium_page
from .integration import ProcessGroup, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.integration]

SETUP = """
from clusters.models import Cluster
from clusters.roles import Role, assign_role
from django.contrib.auth import get_user_model
from nodes.services import do_issue_join_token
from repairs.models import RepairSettings

cluster = Cluster.objects.create(name="embedded", slug="embedded")
RepairSettings.objects.create(cluster=cluster)
user = get_user_model().objects.create_user("alice", password="password")
assign_role(user, Role.OPERATOR)
print(do_issue_join_token(cluster)[1])
"""

STEPS = """
import json
from repairs.models import RepairStep
from healthchecks.models import CheckRun
from nodes.models import AgentCommand
print(json.dumps({
    "steps": [[s.kind, s.status, s.finished_at.timestamp() if s.finished_at else None]
              for s in RepairStep.objects.order_by("position")],
    "runs": [[r.check_name, r.purpose, r.status, r.sent_at is not None]
             for r in CheckRun.objects.order_by("id")],
    "commands": [[c.action, c.status] for c in AgentCommand.objects.order_by("id")],
}))
"""


def manage(env, *args):
    """A management command in the embedded environment; its stdout."""
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def embedded(request):
    """daphne, a Celery worker and beat, and one simulated agent, all in the embedded mode
    on a data directory of their own."""
    directory = ARTIFACTS / "embedded" / request.node.name
    shutil.rmtree(directory, ignore_errors=True)
    data = directory / "var"
    data.mkdir(parents=True)
    env = subprocess_env(CLUSTERUI_MODE="embedded", CLUSTERUI_DATA_DIR=str(data),
                         CLUSTERUI_BOOT_WINDOW_S="0", PYTHONUNBUFFERED="1")
    for production_only in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "SECRET_KEY",
                            "ALLOWED_HOSTS", "SECURE_COOKIES", "CLUSTERUI_METRICS_TOKEN"):
        env.pop(production_only, None)
    manage(env, "migrate", "--noinput", "-v0")
    manage(env, "declare_task_queues")  # as scripts/demo.sh does before Celery starts
    join_token = manage(env, "shell", "-c", SETUP).strip().splitlines()[-1]
    group = ProcessGroup(directory, env)
    try:
        server = group.daphne()
        group.celery("worker", "--concurrency=1", "-P", "solo", "--without-heartbeat",
                     "--without-gossip", "--without-mingle")
        group.celery("beat", "-s", directory / "beat-schedule", "--max-interval", "1")
        group.agent("gpu-017", server, token=join_token, inject="xid:79@3s:gpu3",
                    extra_args=["--simulated-boot", "2"])
        group.server, group.env = server, env
        yield group
    finally:
        group.stop_all()
        if any(getattr(request.node, f"rep_{when}", None) is not None
               and getattr(request.node, f"rep_{when}").failed for when in ("setup", "call")):
            group.report()


@pytest.fixture
def embedded_page(embedded, monkeypatch, request):
    yield from chromium_page(embedded.server, monkeypatch, request)


def test_what_a_worker_does_reaches_the_open_tab_and_the_agent_through_the_feed(
        embedded, embedded_page, request):
    page = embedded_page
    fetches = []
    page.on("requestfinished", lambda r: fetches.append((time.time(), r.url))
            if r.headers.get("hx-request") and r.method == "GET" else None)
    tab = "/c/embedded/repair/"
    page.goto(tab)
    sign_in(page, "alice", "password")
    page.wait_for_load_state("load")
    expect(page.locator("body")).to_have_attribute("data-live", "on")

    # The beat's recommender read the agent's Xid from the feed; the tab shows it live.
    approve = page.locator("#repair-awaiting").get_by_role("button", name="Approve")
    expect(approve).to_be_visible(timeout=60_000)
    card_id = page.locator("#repair-awaiting .repair").first.get_attribute("id")
    approve.click()
    running = page.locator(f"#repair-running #{card_id}")
    expect(running.locator(".steps li")).to_have_count(6)

    # When the page first showed each step done (the worker wrote it).
    shown_done = {}
    steps = running.locator(".steps li")
    kinds = ["drain", "collect the diagnostic bundle", "act", "wait for node", "verify",
             "resume"]
    finished_card = page.locator(f"#repair-history #history-{card_id.removeprefix('repair-')}")

    def all_shown():
        embedded.server.check_running()
        if finished_card.count():  # out of Running: each step not seen done yet is done now
            for kind in kinds:
                shown_done.setdefault(kind, time.time())
            return True
        # One read that never waits: the card may leave Running between two reads.
        badges = steps.locator(".badge").all_inner_texts()
        for kind, badge in zip(kinds, badges):
            if kind not in shown_done and "done" in badge:
                shown_done[kind] = time.time()
        return len(shown_done) == len(kinds)

    wait_until(all_shown, timeout=120,
               what="every step of the repair showed as done in the open tab")
    expect(finished_card).to_contain_text("succeeded")
    path = screenshot(page, "embedded-repair-succeeded")
    print(f"screenshot: {path}")

    facts = json.loads(manage(embedded.env, "shell", "-c", STEPS).strip().splitlines()[-1])
    finished = {kind: at for kind, status, at in facts["steps"] if status == "done"}
    assert len(finished) == 6, facts
    lags = {}
    for (kind, _, at), label in zip(facts["steps"], kinds):
        lags[label] = shown_done[label] - at
    print("shown in the tab after the worker finished the step (s):",
          {kind: round(lag, 2) for kind, lag in lags.items()})
    # A step shown done before the worker finished it is impossible; one step can be
    # shown only once the next one finished too (the tab re-fetches at most once a second).
    # The upper bound leaves room for a slow machine; "no polling" is checked below.
    assert all(-0.1 < lag < 5.0 for lag in lags.values()), lags

    # The bundle and the reboot commands and the checks after the reboot were asked in the
    # worker, and went out on the agent's connection (sent) without any re-offer of queued
    # work; the bundle reached the embedded server before the reboot.
    assert facts["commands"] == [["collect_bundle", "ok"], ["reboot", "ok"]], facts
    after_reboot = [run for run in facts["runs"] if run[1] == "after_reboot"]
    assert after_reboot and all(status == "passed" and sent for _, _, status, sent in
                                after_reboot), facts

    # No polling: once the last change's re-fetch is over, the page fetches nothing.
    def settled():
        page.wait_for_timeout(200)
        return not fetches or time.time() - fetches[-1][0] > 2.0

    wait_until(settled, timeout=30, what="the page's last re-fetch is over")
    quiet_from = time.time()
    page.wait_for_timeout(6000)
    assert [url for at, url in fetches if at > quiet_from] == []
    assert not request.node.console_log.errors, str(request.node.console_log)
    assert_no_csp_violations(request.node.console_log)
