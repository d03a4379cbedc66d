"""In Chromium, from a new cluster to a ready one (issue 28): an admin creates a Kubernetes
cluster on the creation page, with acceptance tests on and OIDC for the Kubernetes API from
the tests' real OpenID Connect provider; the review connects to the (fake) API server, reads
the provider's discovery document and shows the API server's flags. The cluster is
*provisioning*. The settings page's install command, run as a
node would run it, installs the real agent wheel into a fresh virtualenv from this
console's wheelhouse (scripts/test.sh built it; nothing comes from outside loopback) and
writes its config, join token and unit. The installed agent, started from that config on
the simulated backend, arrives *pending*; the cluster is *accepting* until the battery
passes, then *ready*, and the node goes on through *booting* to *healthy*."""

import os
import subprocess

import pytest
from django.conf import settings
from playwright.sync_api import expect

from clusters.models import Cluster, ClusterTransition
from clusters.roles import Role
from clusters.tests.factories import UserFactory
from nodes.choices import NodeState
from nodes.models import Node, NodeTransition
from nodes.wheelhouse import read_manifest

from schedulers.tests.kubernetes_fake import fake_api, write_kubeconfig  # noqa: F401 (fixture)

from .browser import assert_no_csp_violations, screenshot, sign_in
from .conftest import chromium_page
from .integration import Process, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

NODE = "gpu-new-001"


@pytest.fixture
def stack(processes):
    if read_manifest() is None:
        pytest.fail(f"no agent wheelhouse in {settings.CLUSTERUI_AGENT_WHEELHOUSE}: "
                    "scripts/test.sh builds it (make test)")
    # A boot window longer than the battery takes: the node shows *booting* after it passes.
    server = processes.daphne(CLUSTERUI_BOOT_WINDOW_S="20")
    processes.celery("worker", "--concurrency=1", "-P", "solo", "--without-heartbeat",
                     "--without-gossip", "--without-mingle")
    processes.celery("beat", "-s", processes.directory / "beat-schedule", "--max-interval", "1")
    processes.server = server
    return processes


@pytest.fixture
def browser_page(stack, monkeypatch, request):
    yield from chromium_page(stack.server, monkeypatch, request)


def run_install_command(command, root, tmp_path):
    """The page's command as root runs it, with its files under `root` (CLUSTERUI_AGENT_ROOT)
    and none of this machine's pip configuration."""
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CLUSTERUI_AGENT_ROOT": str(root),
           "PIP_CONFIG_FILE": os.devnull}
    done = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"the install command failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_a_new_cluster_installs_its_agent_from_the_console_and_turns_ready(
        stack, browser_page, request, tmp_path, oidc_provider, fake_api):
    page = browser_page
    UserFactory(username="ada", role=Role.ADMIN)
    kubeconfig = write_kubeconfig(fake_api, tmp_path / "kubeconfig")
    page.goto("/clusters/new/")
    sign_in(page, "ada")
    page.fill("#id_name", "bring-up")
    page.fill("#id_slug", "bring-up")
    page.fill("#id_gpu_type", "NVIDIA H200")
    page.fill("#id_planned_nodes", "16")
    page.select_option("#id_scheduler", "kubernetes")
    page.fill("#id_scheduler_config", str(kubeconfig))
    page.check("#id_long_running")
    page.check("#id_acceptance_tests_enabled")
    page.fill("#id_oidc_issuer_url", oidc_provider.issuer)
    page.fill("#id_oidc_client_id", "kubectl")
    page.fill("#id_oidc_groups_claim", "groups")
    page.check("input[name=startup_scripts][value=slack-job-end]")
    screenshot(page, "create-cluster")
    page.click("button[name=step][value=review]")

    expect(page.locator("#scheduler-answer")).to_contain_text("the API server answered")
    expect(page.locator("#apiserver-flags")).to_contain_text(
        f"--oidc-issuer-url={oidc_provider.issuer}")
    expect(page.locator("#apiserver-flags")).to_contain_text("--oidc-groups-claim=groups")
    expect(page.locator("#acceptance-recommendation")).to_contain_text("Recommended on")
    screenshot(page, "create-cluster-review")
    assert not Cluster.objects.filter(slug="bring-up").exists()  # nothing saved on review
    page.click("button[name=step][value=create]")
    expect(page.locator("#cluster-status .badge")).to_have_text("provisioning")
    cluster = Cluster.objects.get(slug="bring-up")
    assert cluster.kubernetes_access.oidc_issuer_url == oidc_provider.issuer

    page.goto("/c/bring-up/settings/")
    page.click("#join-tokens form.token-form button[type=submit]")
    token = page.locator("#join-tokens input.token").input_value()
    command = page.locator("#install-command").inner_text()
    expect(page.locator("#agent-daemonset")).to_be_visible()  # a Kubernetes cluster's option
    screenshot(page, "settings-install-agent")

    root = tmp_path / "root"
    token_file = root / "etc/clusterui-agent/join-token"
    token_file.parent.mkdir(parents=True)
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    run_install_command(command, root, tmp_path)

    venv = root / "opt/clusterui-agent/venv"
    where = subprocess.run([venv / "bin/python", "-c", "import agent; print(agent.__file__)"],
                           capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert where.startswith(str(venv)), where  # the wheel's agent, not this checkout's
    unit = (root / "etc/systemd/system/clusterui-agent.service").read_text()
    assert f"ExecStart={venv}/bin/clusterui-agent --config" in unit

    env = {k: v for k, v in stack.env.items() if k != "PYTHONPATH"}
    agent = Process("installed agent", [
        venv / "bin/clusterui-agent", "--config", root / "etc/clusterui-agent/agent.toml",
        # The config names /etc/clusterui-agent/join-token; this one is under the root.
        "--token-file", token_file, "--state-dir", tmp_path / "state", "--simulate",
        "--node-name", NODE, "--simulated-boot", "1"], env=env,
        log_path=stack.directory / "installed-agent.log")
    stack._add(agent).start()

    node = wait_until(lambda: Node.objects.filter(cluster=cluster, name=NODE).first(),
                      timeout=60, what="the installed agent's node registered")
    wait_until(lambda: Node.objects.get(pk=node.pk).state == NodeState.HEALTHY, timeout=150,
               what="the node passed its battery and its boot window ended")
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY

    states = list(NodeTransition.objects.filter(node=node).order_by("at", "pk")
                  .values_list("to_state", flat=True))
    assert states == [NodeState.PENDING, NodeState.BOOTING, NodeState.HEALTHY]
    statuses = list(ClusterTransition.objects.filter(cluster=cluster).order_by("at", "pk")
                    .values_list("to_status", flat=True))
    assert statuses == [Cluster.Status.ACCEPTING, Cluster.Status.READY]

    page.goto("/c/bring-up/")
    expect(page.locator("#cluster-status .badge")).to_have_text("ready")
    expect(page.locator(".cluster-status-row")).to_have_count(2)
    page.goto("/clusters/")
    expect(page.locator('[data-cluster-status="ready"]')).to_have_count(1)
    assert_no_csp_violations(request.node.console_log)
