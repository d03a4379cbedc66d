"""In Chromium: the approval cards an on-call engineer decides from, one per kind of fault:
Xid 79 (restart the machine), Xid 48 (NVIDIA's workflow in a sentence), job_leftovers (the
clean-up, the node staying in service), a thermal slowdown that persisted (how long, how
hot) and an escalation (what it follows). Each card answers what is wrong, what approving
costs and why this action, and nothing says "the default for". The screenshots are the
ones in docs/repair-cards/."""

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from clusters.roles import Role
from clusters.tests.factories import ClusterFactory, UserFactory
from healthchecks.services import do_close_health_event, do_record_health_event
from nodes.models import NodeRollup
from nodes.tests.factories import GpuFactory, NodeFactory
from repairs.choices import Status
from nodes.models import DiagnosticBundle
from repairs.models import RepairStep
from repairs.services import refresh_recommendation
from repairs.tests.factories import RepairFactory

from .browser import assert_no_csp_violations, element_screenshot, in_a_thread, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.integration,
              pytest.mark.django_db(transaction=True)]


def node_with_gpus(cluster, name):
    node = NodeFactory(cluster=cluster, name=name)
    for index in range(8):
        GpuFactory(node=node, index=index, uuid=f"GPU-{name}-{index}", name="NVIDIA H200",
                   serial=f"16541240{int(name[-3:]):03d}{index:02d}")
    return node


def five_faults(cluster):
    """The five cards' faults, each on a node of its own; the recommendations made."""
    now = timezone.now()
    cards = {}
    node = node_with_gpus(cluster, "gpu-011")
    do_record_health_event(node, signature="xid:79", severity="critical",
                           gpu=node.gpus.get(index=3), message="GPU has fallen off the bus")
    cards["xid79"] = refresh_recommendation(node)

    node = node_with_gpus(cluster, "gpu-012")
    do_record_health_event(node, signature="xid:48", severity="critical",
                           gpu=node.gpus.get(index=5),
                           message="An uncorrectable double bit error (DBE) has been "
                                   "detected on GPU in the framebuffer")
    cards["xid48"] = refresh_recommendation(node)

    node = node_with_gpus(cluster, "gpu-013")
    do_record_health_event(node, signature="job_leftovers", severity="warning",
                           gpu=node.gpus.get(index=2),
                           message="job 46076 ended; pid 5123 (python3) still holds 1024 MiB "
                                   "on GPU 2")
    cards["job_leftovers"] = refresh_recommendation(node)

    node = node_with_gpus(cluster, "gpu-014")
    gpu = node.gpus.get(index=6)
    do_record_health_event(node, signature="thermal_throttle", severity="warning", gpu=gpu,
                           message="thermal slowdown held for 60 s (clock event reasons: "
                                   "SW thermal slowdown)",
                           evidence={"temp_c": 84}, now=now - timedelta(minutes=16))
    for minutes_ago, hottest in ((15, 86), (9, 88), (2, 87)):
        NodeRollup.objects.create(
            node=node, minute=(now - timedelta(minutes=minutes_ago)).replace(second=0,
                                                                             microsecond=0),
            gpus={gpu.uuid: {"temp_c": [82, hottest]}})
    cards["throttle"] = refresh_recommendation(node, now=now)

    node = node_with_gpus(cluster, "gpu-015")
    gpu = node.gpus.get(index=1)
    earlier = do_record_health_event(node, signature="xid:79", severity="critical", gpu=gpu,
                                     message="GPU has fallen off the bus",
                                     now=now - timedelta(days=3, hours=2))
    RepairFactory(node=node, gpu=gpu, action="reboot", signature="xid:79",
                  status=Status.SUCCEEDED, requested_at=now - timedelta(days=3, hours=2),
                  started_at=now - timedelta(days=3, hours=2),
                  finished_at=now - timedelta(days=3, hours=1),
                  outcome="repaired: drained, acted, back, verified and resumed")
    do_close_health_event(earlier, reason="rebooted", now=now - timedelta(days=3, hours=1))
    do_record_health_event(node, signature="xid:79", severity="critical", gpu=gpu,
                           message="GPU has fallen off the bus", now=now)
    cards["escalation"] = refresh_recommendation(node, now=now)
    return cards


EXPECTED = {
    "xid79": ("reboot", ["Why: NVIDIA: restart the machine (RESTART_BM)",
                         "No scheduler configured", "Blast radius: 1 of 5 nodes",
                         "Drain: now: requeue the jobs that Slurm can requeue"]),
    "xid48": ("reset_gpu", ["Why: NVIDIA: reset the GPU when the error comes alone; drain and "
                         "reset it with Xid 63 or 64"]),
    "job_leftovers": ("cleanup", ["The clean-up ends the processes that still hold GPU memory",
                                  "gpu-013 stays in service"]),
    "throttle": ("failover", ["held 16 min, up to 88 °C", "Why: The GPU keeps slowing itself",
                              "Drain: after the jobs end: wait up to 24 h 00 min"]),
    "escalation": ("reprovision", ["Why: xid:79 came back 3 days after repair #",
                                   "the next rung is reprovision", "After #"]),
}


def test_each_kind_of_card_answers_what_is_wrong_what_it_costs_and_why(page, console):
    cluster = ClusterFactory(name="cards-h200", slug="cards-h200", gpu_type="NVIDIA H200")
    UserFactory(username="alice", role=Role.OPERATOR)
    cards = in_a_thread(five_faults, cluster)
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(f"/c/{cluster.slug}/repair/")
    sign_in(page, "alice", "password")
    # The tab re-fetches its sections once its live socket opens: let that be over, so a
    # card is not swapped out while it is photographed.
    expect(page.locator("body")).to_have_attribute("data-live", "on")
    page.wait_for_timeout(2500)
    for name, repair in cards.items():
        action, texts = EXPECTED[name]
        assert repair is not None and repair.action == action, (name, repair)
        card = page.locator(f"#repair-{repair.public_id}")
        for text in texts:
            expect(card).to_contain_text(text)
        expect(card).not_to_contain_text("the default for")
        element_screenshot(card, f"repair-card-{name}")
    assert not console.errors, str(console)
    assert_no_csp_violations(console)


def a_drain_waiting_for_jobs(cluster):
    """A running reboot whose drain (signal, then wait) waits for a 3-node job."""
    node = node_with_gpus(cluster, "gpu-021")
    repair = RepairFactory(node=node, cluster=cluster, signature="ecc_dbe", status=Status.RUNNING,
                           reason="An uncorrectable ECC error: the GPU's memory cannot be "
                                  "trusted until it is reset.",
                           started_at=timezone.now() - timedelta(minutes=3),
                           drain_mode="signal", drain_deadline_s=600, drain_signal="USR1")
    started = timezone.now() - timedelta(minutes=3)
    RepairStep.objects.create(
        repair=repair, position=0, kind="drain", status="waiting", started_at=started,
        next_check_at=timezone.now() + timedelta(seconds=15), attempts=13,
        message="drained; sent SIGUSR1; waiting for 1 job(s) to end (46131)",
        details={"jobs": [{"id": "46131", "user": "maria", "name": "llama-70b pretrain",
                           "nodes": ["gpu-019", "gpu-020", "gpu-021"], "time_left_s": 20140}],
                 "deadline": (started + timedelta(seconds=600)).isoformat(),
                 "signalled_at": started.isoformat()})
    for position, kind in enumerate(["act", "wait_for_node", "verify", "resume"], start=1):
        RepairStep.objects.create(repair=repair, position=position, kind=kind)
    return repair


def test_a_drain_waiting_for_jobs_shows_them_its_deadline_and_go_on_now(page, console):
    cluster = ClusterFactory(name="cards-h200", slug="cards-h200", gpu_type="NVIDIA H200")
    UserFactory(username="alice", role=Role.OPERATOR)
    repair = in_a_thread(a_drain_waiting_for_jobs, cluster)
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(f"/c/{cluster.slug}/repair/{repair.public_id}/")
    sign_in(page, "alice", "password")
    card = page.locator(f"#repair-{repair.public_id}")
    for text in ["Drain: signal, then wait: SIGUSR1 to each job's batch shell",
                 "waiting for jobs", "46131", "maria", "gpu-019, gpu-020, gpu-021",
                 "5 h 35 min", "Deadline"]:
        expect(card).to_contain_text(text)
    expect(card.get_by_role("button", name="Go on now")).to_be_visible()
    element_screenshot(card, "repair-card-waiting-for-jobs")
    assert not console.errors, str(console)
    assert_no_csp_violations(console)


def a_repair_with_its_bundle(cluster):
    """A reboot that succeeded, with the diagnostic bundle taken before it."""
    node = node_with_gpus(cluster, "gpu-022")
    done = timezone.now() - timedelta(minutes=20)
    bundle = DiagnosticBundle.objects.create(
        node=node, reason="before repair (reboot)", requested_at=done, max_bytes=64 * 2**20,
        deadline_s=120, status="stored", stored_at=done + timedelta(seconds=9),
        size_bytes=3_481_022, sha256="9f2c41d6e3b0a8c4f1e7d2b5a6c3f8e1d4b7a0c9e2f5d8b1a4c7e0f3d6b9a2c5",
        listing=[{"name": f"gpu-022/{name}", "size": size} for name, size in (
            ("manifest.json", 1904), ("kernel-gpu.log", 2210), ("kernel-tail.log", 181_337),
            ("nvidia-smi-q.xml", 27202), ("nvml.json", 9120), ("agent-events.json", 2208),
            ("slurmd.log", 88_410), ("nvidia-bug-report.log.gz", 3_170_631))])
    return RepairFactory(node=node, cluster=cluster, status=Status.SUCCEEDED, bundle=bundle,
                         started_at=done - timedelta(minutes=2), finished_at=done,
                         drain_mode="now", outcome="repaired: drained, acted, back, verified "
                                                   "and resumed")


def test_a_repair_shows_its_diagnostic_bundle(page, console):
    cluster = ClusterFactory(name="cards-h200", slug="cards-h200", gpu_type="NVIDIA H200")
    UserFactory(username="alice", role=Role.OPERATOR)
    repair = in_a_thread(a_repair_with_its_bundle, cluster)
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(f"/c/{cluster.slug}/repair/{repair.public_id}/")
    sign_in(page, "alice", "password")
    card = page.locator(f"#repair-{repair.public_id}")
    for text in ["Diagnostic bundle before repair (reboot)", "3.3 MB", "8 files",
                 "9f2c41d6e3b0a8c4"]:
        expect(card).to_contain_text(text)
    expect(card.get_by_role("link", name="Download")).to_be_visible()
    card.locator("details summary", has_text="files").click()
    expect(card).to_contain_text("gpu-022/nvidia-bug-report.log.gz")
    element_screenshot(card, "repair-card-with-bundle")
    assert not console.errors, str(console)
    assert_no_csp_violations(console)
