"""Issue 5's demo path over real processes: daphne (production mode), the real agent
(`python -m agent --simulate`) injecting Xid 79, a Celery worker and beat running the
repair's steps. Xid 79 -> a reboot recommendation -> approve -> drained, the agent's
diagnostic bundle uploaded to daphne (its kernel log holds the Xid; an operator downloads
it, SHA-256 checked), rebooted (new boot id), checked, resumed, healthy.

Every process uses the session's Redis database, as this test process does: the approval
made here is a Celery message the worker must receive.
"""

import hashlib
import io
import json
import tarfile

import pytest
from django.test import Client
from django.urls import reverse

from clusters.roles import Role
from clusters.tests.factories import ClusterFactory, UserFactory
from healthchecks.models import CheckRun, HealthEvent
from nodes.choices import NodeState
from nodes.models import AgentCommand, Node
from nodes.services import do_issue_join_token
from repairs.choices import Status, StepStatus
from repairs.models import Repair, RepairSettings
from repairs.services import do_approve_repair

from .integration import wait_until
from .test_live_integration import joined_node

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def stack(processes):
    processes.env.update(CLUSTERUI_BOOT_WINDOW_S="0")
    return processes


def test_an_xid_79_is_recommended_approved_and_repaired_by_a_reboot(stack):
    cluster = ClusterFactory(name="int-repair", slug="int-repair")
    RepairSettings.objects.create(cluster=cluster, provider="simulated")
    _, join_token = do_issue_join_token(cluster)
    server = stack.daphne()
    worker = stack.celery("worker", "--concurrency=1", "-P", "solo", "--without-heartbeat",
                          "--without-gossip", "--without-mingle")
    stack.celery("beat", "-s", stack.directory / "beat-schedule", "--max-interval", "1")
    agent = stack.agent("gpu-001", server, token=join_token, inject="xid:79@3s:gpu3",
                        extra_args=["--simulated-boot", "2"])
    node = joined_node(cluster, "gpu-001", agent=agent)
    boot_before = node.boot_id
    wait_until(lambda: worker.check_running() or " ready." in worker.log_text(),
               timeout=30, what="the Celery worker is ready")

    repair = wait_until(lambda: Repair.objects.filter(node=node, status=Status.PROPOSED).first(),
                        timeout=30, what="a repair is recommended for the Xid 79")
    assert (repair.action, repair.signature, repair.gpu.index) == ("reboot", "xid:79", 3)
    assert "RESTART_BM" in repair.reason or "catalog" in repair.reason

    operator = UserFactory(username="int-otto", role=Role.OPERATOR)
    do_approve_repair(repair, actor=operator, comment="go")

    def finished():
        agent.check_running()
        worker.check_running()
        return Repair.objects.filter(pk=repair.pk, status__in=[Status.SUCCEEDED,
                                                               Status.FAILED]).first()

    repair = wait_until(finished, timeout=120, what="the repair finishes")
    steps = list(repair.steps.order_by("position"))
    assert repair.status == Status.SUCCEEDED, [(s.kind, s.status, s.message) for s in steps]
    assert [s.kind for s in steps] == ["drain", "collect_bundle", "act", "wait_for_node",
                                       "verify", "resume"]
    assert all(s.status == StepStatus.DONE for s in steps)

    # The bundle, taken before the reboot: on the repair's page, downloaded whole.
    bundle = repair.bundle
    assert bundle.status == "stored", (bundle.status, bundle.message)
    assert steps[1].message.startswith("diagnostic bundle kept: ")
    names = [entry["name"] for entry in bundle.listing]
    assert names[0] == "gpu-001/manifest.json" and "gpu-001/kernel-gpu.log" in names
    browser = Client()
    browser.force_login(operator)
    page = browser.get(repair.get_absolute_url()).text
    assert bundle.sha256 in page
    response = browser.get(reverse("nodes:bundle_download",
                                   args=[cluster.slug, node.name, bundle.public_id]))
    body = b"".join(response.streaming_content)
    assert hashlib.sha256(body).hexdigest() == bundle.sha256 and len(body) == bundle.size_bytes
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        kernel = tar.extractfile("gpu-001/kernel-gpu.log").read().decode()
        manifest = json.loads(tar.extractfile("gpu-001/manifest.json").read())
    assert "NVRM: Xid" in kernel and "): 79, " in kernel
    assert {entry["file"] for entry in manifest["not_collected"]} == {
        "slurmd.log", "nvidia-bug-report.log.gz"}  # a simulated node has neither

    node = Node.objects.get(pk=node.pk)
    assert node.boot_id != boot_before
    command = AgentCommand.objects.get(node=node, action="reboot")
    assert command.status == "ok"
    checks = CheckRun.objects.filter(node=node, boot_id=node.boot_id)
    assert set(checks.values_list("status", flat=True)) == {"passed"}
    xid = HealthEvent.objects.get(node=node, signature="xid:79")
    assert not xid.is_open and xid.closed_reason.startswith("rebooted and passed")
    wait_until(lambda: Node.objects.get(pk=node.pk).state == NodeState.HEALTHY, timeout=10,
               what="the node is healthy")
    assert list(repair.transitions.values_list("to_status", flat=True)) == [
        "approved", "running", "succeeded"]
