"""`make demo` end to end (issue 27, "How it is shown"): the real scripts/demo.sh, on a data
directory and loopback ports of its own, checked as a newcomer would find it in the first
minutes: in Chromium (the Jobs tab, charts with data, the worst node first, "Needs you",
gpu-012's Xid 79 card and its repair through the demo's simulated Slurm), and through a
real Prometheus scraping its /metrics, on which every panel of NVIDIA's stock DCGM Grafana
dashboard (tests/data/dcgm-exporter-dashboard.json) must find data.

The demo's script runs migrate, seed_demo, daphne, Celery worker and beat, and the simulated
fleet of 64 agents; gpu-012 loses GPU 3 (Xid 79) about 90 s after the fleet starts.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from .browser import (
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_ARGS,
    REPO_ROOT,
    ConsoleLog,
    _die_with_parent,
    free_port,
    screenshot,
    sign_in,
    subprocess_env,
)
from .integration import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.integration]

DASHBOARD = Path(__file__).resolve().parent / "data" / "dcgm-exporter-dashboard.json"
METRICS_TOKEN = "demo-end-to-end-metrics-token"
PROMETHEUS = "/usr/bin/prometheus"
# The demo's facts (demo/seed.py, agent/sim/workload.py): gpu-012's GPU 3 falls off the bus
# 90 s after the fleet starts, while gpu-009 to gpu-016 run one 8-node pretraining job.
FAULTY_NODE = "gpu-012"
LONG_RUN_NODES = [f"gpu-{n:03d}" for n in range(9, 17)]
XID_79_AFTER_S = 90
# What `make test` exports for its production mode; `make demo` runs without it.
PRODUCTION_ONLY = ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "SECRET_KEY",
                   "ALLOWED_HOSTS", "SECURE_COOKIES", "CLUSTERUI_SECRETS_KEYS")

# The demo cluster's nodes as its database has them: name, state, and whether an open
# critical health event holds the node.
NODE_FACTS = """
import json
from django.db.models import Exists, OuterRef
from healthchecks.models import HealthEvent
from nodes.models import Node
critical = HealthEvent.objects.filter(node=OuterRef("pk"), closed_at__isnull=True,
                                      severity="critical")
nodes = Node.objects.filter(cluster__slug="demo").annotate(critical=Exists(critical))
print(json.dumps(sorted([n.name, n.state, n.critical] for n in nodes)))
"""


class Demo:
    """scripts/demo.sh running in its own data directory, on free loopback ports."""

    def __init__(self, data_dir, log_path):
        self.data_dir = data_dir
        self.log_path = log_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.slurm_state = data_dir / "fleet" / "slurm.json"
        env = subprocess_env(
            PY=sys.executable,
            DEMO_PORT=str(self.port),
            DEMO_RECEIVER_PORT=str(free_port()),
            DEMO_RESET="1",
            CLUSTERUI_DATA_DIR=str(data_dir),
            CLUSTERUI_METRICS_TOKEN=METRICS_TOKEN,
            PYTHONUNBUFFERED="1",
        )
        for name in PRODUCTION_ONLY:
            env.pop(name, None)
        env.pop("CLUSTERUI_PUBLIC_URL", None)
        self.env = env
        self.process = None
        self.console_up_at = None

    def start(self, timeout_s=240):
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            ["bash", str(REPO_ROOT / "scripts" / "demo.sh")], cwd=REPO_ROOT, env=self.env,
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout_s
        while not self.answers():
            if self.process.poll() is not None:
                raise RuntimeError(f"scripts/demo.sh exited with status "
                                   f"{self.process.returncode} before the console answered:\n"
                                   f"{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the demo's console did not answer within {timeout_s} s:\n"
                                   f"{self.log_tail()}")
            time.sleep(0.5)
        self.console_up_at = time.monotonic()
        return self

    def answers(self):
        try:
            with urllib.request.urlopen(f"{self.url}/accounts/login/", timeout=5) as response:
                return response.status == 200
        except OSError:
            return False

    def seconds_until_xid_79_is_late(self, margin_s=90):
        """The fleet starts as the console answers; gpu-012's Xid 79 comes XID_79_AFTER_S
        later, and what follows from it within margin_s."""
        return max(10.0, self.console_up_at + XID_79_AFTER_S + margin_s - time.monotonic())

    def stop(self, timeout_s=60):
        """SIGINT, as Ctrl-C: the script stops its children and exits. Returns its status,
        or None if it had to be killed."""
        if self.process is None:
            return None
        status = self.process.poll()
        if status is None:
            self.process.send_signal(signal.SIGINT)
            try:
                status = self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                status = None
        self._log.close()
        return status

    def children(self):
        """{name: pid} of what the script started, from its log ("started daphne (pid N)")."""
        return {name: int(pid) for name, pid
                in re.findall(r"^==> started (\w+) \(pid (\d+)\)$", self.log_text(), re.M)}

    def log_text(self):
        return self.log_path.read_text(errors="replace")

    def log_tail(self, lines=80):
        return "\n".join(self.log_text().splitlines()[-lines:])

    def manage_shell(self, code):
        """stdout of `manage.py shell -c code` against the demo's database."""
        env = dict(self.env, CLUSTERUI_MODE="embedded")
        done = subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=REPO_ROOT,
                              env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def node_facts(self):
        """[[name, state, has an open critical event], ...] of the demo cluster's nodes."""
        return json.loads(self.manage_shell(NODE_FACTS).strip().splitlines()[-1])

    def slurm(self):
        """The simulated Slurm's state file (agent/sim/workload.py): drains and jobs."""
        return json.loads(self.slurm_state.read_text())

    def scontrol_show_node(self, name):
        """`scontrol show node NAME` as the demo's own processes run it (demo/bin/ first on
        their PATH)."""
        env = dict(self.env, DEMO_SLURM_PYTHON=sys.executable,
                   DEMO_SLURM_STATE=str(self.slurm_state))
        done = subprocess.run([str(REPO_ROOT / "demo" / "bin" / "scontrol"), "show", "node",
                               name], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    log_dir = ARTIFACTS / "demo-end-to-end"
    shutil.rmtree(log_dir, ignore_errors=True)
    running = Demo(tmp_path_factory.mktemp("demo") / "var", log_dir / "demo.log")
    try:
        yield running.start()
    finally:
        children = running.children()
        status = running.stop()
        left = sorted(name for name, pid in children.items() if alive(pid))
        if status != 130 or left:
            print(f"scripts/demo.sh's log (tail):\n{running.log_tail()}")
        assert status == 130, f"scripts/demo.sh did not stop on SIGINT (status {status})"
        assert not left, f"scripts/demo.sh exited, and left these children running: {left}"


@pytest.fixture(scope="module")
def signed_in_browser(demo):
    """A Chromium context on the demo, signed in as demo/demo (an operator)."""
    playwright = sync_playwright().start()
    try:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                             args=CHROMIUM_ARGS)
        context = browser.new_context(base_url=demo.url, viewport={"width": 1280, "height": 900})
        context.set_default_timeout(30_000)
        page = context.new_page()
        page.goto("/c/demo/")
        sign_in(page, "demo", "demo")
        page.close()
        yield context
        browser.close()
    finally:
        playwright.stop()


@pytest.fixture
def page(signed_in_browser, demo, request):
    new_page = signed_in_browser.new_page()
    console = ConsoleLog(new_page)
    yield new_page
    call = getattr(request.node, "rep_call", None)
    if call is not None and call.failed:
        path = screenshot(new_page, f"FAILED-{request.node.name}")
        print(f"screenshot of the page at failure: {path}")
        print(f"browser console:\n{console}")
        print(f"scripts/demo.sh's log (tail):\n{demo.log_tail()}")
    new_page.close()


def number(text):
    return float(text.replace(",", "").strip())


def test_the_jobs_tab_shows_jobs_with_their_gpu_hours_and_cost(page):
    page.goto("/c/demo/")
    page.get_by_role("link", name="Jobs", exact=True).click()
    expect(page).to_have_url(re.compile(r"/c/demo/jobs/"))
    rows = page.locator("#usage-by-user tbody tr[data-user]")
    expect(rows.first).to_be_visible()
    rates = []
    for row in rows.all():
        gpu_hours = number(row.locator("[data-gpu-hours]").inner_text())
        cost = number(row.locator("[data-cost]").inner_text())
        assert gpu_hours > 0 and cost > 0, row.inner_text()
        rates.append(cost / gpu_hours)
    # One cluster, one price per GPU-hour: each user's cost is its GPU-hours at that rate.
    assert max(rates) - min(rates) < 0.001, rates
    expect(page.locator("#usage-by-account tbody tr[data-account]").first).to_be_visible()
    expect(page.locator("table.jobs tbody tr[data-job]").first).to_be_visible()
    # gpu-012's jobs: the long pretraining run on gpu-009 to gpu-016 among them.
    page.goto(f"/c/demo/jobs/?node={FAULTY_NODE}")
    long_run = page.locator("table.jobs tbody tr[data-job]").filter(has_text="gpu-[009-016]")
    expect(long_run.first.locator("td").nth(6)).to_have_text("64")  # GPUs


def plot_points(page):
    """[[chart, [points with a value, per trace]], ...] of every plotly chart on the page."""
    return page.evaluate("""() => Array.from(document.querySelectorAll('.js-plotly-plot'))
        .map(el => [el.id || el.dataset.metric,
                    el.data.map(t => t.y.filter(v => v !== null && v !== undefined).length)])""")


def test_no_chart_on_the_overview_or_a_node_page_is_empty(page):
    page.goto("/c/demo/")
    expect(page.locator(".js-plotly-plot")).to_have_count(1)
    charts = plot_points(page)
    assert [name for name, _ in charts] == ["usage-chart"], charts
    empty = [(name, traces) for name, traces in charts if not traces or 0 in traces]
    assert not empty, f"charts with a trace without data points: {empty}"

    page.goto(f"/c/demo/nodes/{FAULTY_NODE}/")
    metrics = page.locator(".chart[data-metric]").evaluate_all(
        "charts => charts.map(c => c.dataset.metric)")
    assert "util_pct" in metrics, metrics
    expect(page.locator(".js-plotly-plot")).to_have_count(len(metrics))
    charts = plot_points(page)
    assert sorted(name for name, _ in charts) == sorted(metrics), charts
    empty = [(name, traces) for name, traces in charts if not traces or 0 in traces]
    assert not empty, f"charts with a trace without data points: {empty}"
    expect(page.locator("#charts-empty")).to_be_hidden()


def worst_first_key(facts):
    """The node list's default order (docs/tour.md): unhealthy with a critical signal, other
    unhealthy, pending, booting, paused, then the rest; by name within each."""
    name, state, critical = facts
    order = ["unhealthy", "pending", "booting", "paused"]
    rank = order.index(state) + 1 if state in order else len(order) + 1
    if state == "unhealthy" and critical:
        rank = 0
    return rank, name


def seen_while_the_nodes_stand_still(demo, look, attempts=4):
    """(node facts, look()) with the same node facts before and after look(): the demo is
    live, and a node may change state between reading its database and loading a page."""
    for _ in range(attempts):
        before = demo.node_facts()
        seen = look()
        if demo.node_facts() == before:
            return before, seen
    raise AssertionError(f"the demo's nodes kept changing over {attempts} attempts")


def test_the_node_list_shows_the_worst_node_first(page, demo):
    def first_row():
        page.goto("/c/demo/nodes/")
        row = page.locator("table.node-list tbody tr").first
        return row.get_attribute("data-node"), row.inner_text()

    facts, (first, text) = seen_while_the_nodes_stand_still(demo, first_row)
    worst = min(facts, key=worst_first_key)
    assert worst[1] == "unhealthy", facts  # the seeded day leaves unhealthy nodes
    assert first == worst[0], f"first row {first!r} ({text}); the worst node is {worst}"


def panels(items):
    for panel in items:
        yield panel
        yield from panels(panel.get("panels", []))


def grafana_expression(expr, variables):
    """A panel's query with Grafana's variables filled in: each dashboard variable matches
    every value (`.+`); the interval macros are one minute."""
    for macro in ("$__rate_interval", "$__interval", "$__range", "${__rate_interval}",
                  "${__interval}", "${__range}"):
        expr = expr.replace(macro, "1m")
    for name in variables:
        expr = re.sub(r"\$\{" + name + r"(:[^}]*)?\}|\[\[" + name + r"\]\]|\$" + name + r"\b",
                      ".+", expr)
    return expr


def prometheus_query(url, expr):
    query = urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=30) as response:
            return json.load(response)
    except urllib.error.HTTPError as error:
        return json.load(error)


def test_every_panel_of_nvidias_dcgm_dashboard_finds_data_in_prometheus(demo, tmp_path):
    assert os.access(PROMETHEUS, os.X_OK), (
        f"{PROMETHEUS} is missing: scripts/test.sh installs Debian's prometheus package")
    token_file = tmp_path / "clusterui-token"
    token_file.write_text(METRICS_TOKEN + "\n")
    token_file.chmod(0o600)
    config = tmp_path / "prometheus.yml"
    config.write_text(f"""\
global:
  scrape_interval: 2s
  scrape_timeout: 2s
scrape_configs:
  - job_name: clusterui
    authorization:
      credentials_file: {token_file}
    static_configs:
      - targets: ["127.0.0.1:{demo.port}"]
""")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = ARTIFACTS / "demo-end-to-end" / "prometheus.log"
    with log_path.open("wb") as log:
        prometheus = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        try:
            def scrapes():
                result = prometheus_query(url, 'sum_over_time(up{job="clusterui"}[1m])')
                values = (result.get("data") or {}).get("result") or []
                return values and float(values[0]["value"][1]) >= 3

            def answering():
                try:
                    return scrapes()
                except OSError:
                    return False

            wait_until(answering, timeout=90, what="three good scrapes of the demo's /metrics",
                       interval=1)
            dashboard = json.loads(DASHBOARD.read_text())
            variables = [v["name"] for v in dashboard.get("templating", {}).get("list", [])
                         if v.get("type") != "datasource"]
            checked, failures = [], []
            for panel in panels(dashboard["panels"]):
                for target in panel.get("targets", []):
                    if not target.get("expr"):
                        continue
                    expr = grafana_expression(target["expr"], variables)
                    checked.append(panel["title"])
                    result = prometheus_query(url, expr)
                    if result.get("status") != "success":
                        failures.append(f"{panel['title']!r}: {expr}: {result.get('error')}")
                    elif not result["data"]["result"]:
                        failures.append(f"{panel['title']!r}: {expr}: no data")
        finally:
            prometheus.terminate()
            prometheus.wait(timeout=30)
    assert checked, f"no panel queries in {DASHBOARD.name}"
    if failures:
        print("panels of the DCGM dashboard without data:\n" + "\n".join(failures))
    assert not failures, (f"{len(failures)} of {len(checked)} panel queries found no data:\n"
                          + "\n".join(failures))


def test_needs_you_lists_the_unhealthy_nodes(page, demo):
    # gpu-012 is unhealthy once its GPU 3 falls off the bus (90 s after the fleet started).
    wait_until(lambda: [FAULTY_NODE, "unhealthy"] in [f[:2] for f in demo.node_facts()],
               timeout=demo.seconds_until_xid_79_is_late(),
               what=f"{FAULTY_NODE} unhealthy", interval=3)

    def needs_you():
        page.goto("/c/demo/")
        return page.locator("#needs-you tr[data-node]").evaluate_all(
            "rows => rows.map(r => r.dataset.node)")

    facts, listed = seen_while_the_nodes_stand_still(demo, needs_you)
    unhealthy = sorted(name for name, state, _ in facts if state == "unhealthy")
    assert FAULTY_NODE in unhealthy
    assert sorted(listed) == unhealthy, f"Needs you lists {listed}; unhealthy: {unhealthy}"

    # Its row leads to the reboot to approve, once the recommender proposed it.
    review = page.locator(f"#needs-you tr[data-node='{FAULTY_NODE}']").get_by_role(
        "link", name=re.compile(r"^Review reboot #"))

    def review_shown():
        if review.count():
            return True
        page.reload()
        return False

    wait_until(review_shown, timeout=demo.seconds_until_xid_79_is_late(),
               what=f"a reboot of {FAULTY_NODE} to review in Needs you", interval=3)


def drain_of(demo, node):
    drains = demo.slurm()["drains"].get(node) or []
    return drains[-1] if drains else None


def test_the_xid_79_card_lists_the_jobs_at_risk_and_its_repair_drains_and_resumes_in_slurm(
        page, demo):
    page.goto("/c/demo/repair/")
    card = page.locator("article.repair").filter(
        has=page.locator("h3", has_text=FAULTY_NODE))

    def card_shown():
        if card.count():
            return True
        page.reload()
        return False

    wait_until(card_shown, timeout=demo.seconds_until_xid_79_is_late(),
               what=f"a repair card for {FAULTY_NODE}", interval=3)
    expect(card).to_have_count(1)
    expect(card.locator("h3")).to_contain_text("reboot")
    expect(card.locator("h3")).to_contain_text("GPU 3")
    status = card.locator(".heading-row .badge")
    expect(status).to_have_text("proposed")
    expect(card).to_contain_text("xid:79")
    expect(card).to_contain_text("GPU has fallen off the bus")
    # The jobs at risk: the one pretraining job, with all eight of its nodes.
    expect(card).to_contain_text(f"1 job stops on 8 nodes ({', '.join(LONG_RUN_NODES)})")
    job_row = card.locator("table.jobs tbody tr")
    expect(job_row).to_have_count(1)
    expect(job_row).to_contain_text("64")
    for node in LONG_RUN_NODES:
        expect(job_row).to_contain_text(node)
    job_id = job_row.locator("td").first.inner_text().strip()
    repair_url = card.locator("h3 a").first.get_attribute("href")
    assert drain_of(demo, FAULTY_NODE) is None

    card.get_by_role("button", name="Approve").click()
    expect(status).not_to_have_text("proposed")
    # Drained through the demo's scontrol: the state file and `scontrol show node` say so.
    drain = wait_until(lambda: drain_of(demo, FAULTY_NODE), timeout=60,
                       what=f"{FAULTY_NODE} drained in the simulated Slurm", interval=0.5)
    assert drain["until"] is None and "repair" in drain["reason"], drain
    assert "DRAIN" in re.search(r"State=(\S+)", demo.scontrol_show_node(FAULTY_NODE)).group(1)
    # The pretraining job is requeued.
    wait_until(lambda: "requeued_at" in demo.slurm()["jobs"].get(job_id, {}), timeout=60,
               what=f"job {job_id} requeued in the simulated Slurm", interval=0.5)

    # When the repair ends, the node is resumed in Slurm.
    resumed = wait_until(lambda: (drain_of(demo, FAULTY_NODE) or {}).get("until"), timeout=180,
                         what=f"{FAULTY_NODE} resumed in the simulated Slurm", interval=1)
    assert resumed >= drain["from"]
    assert "DRAIN" not in re.search(r"State=(\S+)",
                                    demo.scontrol_show_node(FAULTY_NODE)).group(1)
    page.goto(repair_url)
    expect(page.locator("article.repair .heading-row .badge")).to_have_text("succeeded")


def test_celery_beat_sent_every_scheduled_task(demo):
    """Every periodic sweep (heartbeats, recommendations, repair steps) goes through the
    beat: once it cannot send, the demo stands still. On a new broker database the beat and
    both workers create kombu's queue rows at once, and where the beat loses that race
    (UNIQUE constraint failed: kombu_queue.name) its session stays rolled back: every later
    send fails."""
    failures = re.findall(r"Couldn't apply scheduled task ([\w-]+)", demo.log_text())
    assert not failures, (f"celery beat could not send {len(failures)} scheduled tasks "
                          f"({sorted(set(failures))}):\n{demo.log_tail(30)}")
