"""Active check runs on the server: params from the baselines, requests, results, deadlines,
acceptance gating and the checks after a reboot."""

from datetime import timedelta

import pytest
from django.utils import timezone

from clusters.models import AuditEntry
from healthchecks.check_catalog import ACCEPTANCE_CHECKS, AFTER_REBOOT_CHECKS, params_for
from healthchecks.models import CheckRun, HealthEvent
from healthchecks.services import (
    CHECK_RUNS,
    do_record_check_result,
    do_record_health_event,
    do_request_check,
    run_check_frame,
    start_checks_after_hello,
)
from healthchecks.tests.factories import say_hello
from nodes import agent_work
from nodes.choices import NodeState
from nodes.models import Node
from nodes.services import do_register_node
from nodes.tests.factories import GpuFactory, NodeFactory

pytestmark = pytest.mark.django_db

H200 = "NVIDIA H200"
HELLO_GPUS = [{"index": i, "uuid": f"GPU-{i:04d}", "name": H200,
               "pci_bus_id": f"00000000:{i + 6:02X}:00.0", "memory_total_bytes": 150754820096}
              for i in range(8)]


@pytest.fixture(autouse=True)
def no_boot_window(settings):
    settings.CLUSTERUI_BOOT_WINDOW_S = 0


@pytest.fixture
def node(cluster):
    node = do_register_node(cluster, "gpu-001")
    say_hello(node, boot_id="boot-1", gpus=HELLO_GPUS)
    node.refresh_from_db()
    return node


def test_params_carry_the_h200_baselines_less_their_tolerance():
    assert params_for("gpu_compute", {H200}, 8) == {"min_tflops": 709.2}
    assert params_for("gpu_memory_bandwidth", {H200}, 8) == {"min_tbps": 3.87}
    assert params_for("nvml_sanity", {H200}, 8) == {
        "expected_gpus": 8, "pcie_gen": 5, "pcie_width": 16}


def test_a_model_without_baselines_or_a_mixed_node_is_measured_without_thresholds():
    assert params_for("gpu_compute", {"NVIDIA B200"}, 8) == {}
    assert params_for("gpu_compute", {H200, "NVIDIA H100 80GB HBM3"}, 8) == {}
    assert params_for("nvml_sanity", {"NVIDIA B200"}, 8) == {"expected_gpus": 8}


def test_a_request_is_queued_with_its_deadline_and_audited(node, operator):
    now = timezone.now()
    run, created = do_request_check(node, "gpu_compute", actor=operator, now=now)
    assert created and run.status == CheckRun.Status.QUEUED
    assert run.params == {"min_tflops": 709.2} and run.boot_id == "boot-1"
    assert run.deadline_at == now + timedelta(seconds=900)
    assert run_check_frame(run) == {"type": "run_check", "run_id": run.pk,
                                    "check": "gpu_compute", "params": {"min_tflops": 709.2}}
    entry = AuditEntry.objects.get(action="checkrun.request")
    assert entry.actor == operator and entry.changes["check"] == "gpu_compute"


def test_a_double_click_starts_one_run(node, operator):
    first, created = do_request_check(node, "gpu_compute", actor=operator)
    second, created_again = do_request_check(node, "gpu_compute", actor=operator)
    assert created and not created_again and first == second
    assert CheckRun.objects.count() == 1


def test_an_unknown_check_is_refused(node):
    with pytest.raises(ValueError, match="unknown check"):
        do_request_check(node, "rm_rf")


def test_a_failed_run_opens_an_active_event_and_a_passing_one_closes_it(node):
    run, _ = do_request_check(node, "gpu_compute")
    metrics = {"tflops": 540.2, "gpus": {"GPU-0003": {"tflops": 540.2}}, "backend": "torch"}
    do_record_check_result(node, run_id=run.pk, status="failed", metrics=metrics,
                           message="GPU 3 (GPU-0003): 540.2 TFLOP/s, below 709.2")
    run.refresh_from_db()
    event = HealthEvent.objects.get(signature="check:gpu_compute")
    assert run.status == CheckRun.Status.FAILED and run.health_event == event
    assert event.source == "active" and event.severity == "warning" and event.is_open
    assert event.evidence["metrics"] == metrics and "540.2" in event.message
    node.refresh_from_db()
    assert node.state == NodeState.UNHEALTHY

    again, _ = do_request_check(node, "gpu_compute")
    do_record_check_result(node, run_id=again.pk, status="passed",
                           metrics={"tflops": 788.1}, message="")
    event.refresh_from_db()
    assert not event.is_open and event.closed_reason == "GPU compute passed"


def test_an_error_opens_no_event(node):
    run, _ = do_request_check(node, "gpu_compute")
    do_record_check_result(node, run_id=run.pk, status="error",
                           message="needs torch or cupy on the node; neither is installed")
    run.refresh_from_db()
    assert run.status == CheckRun.Status.ERROR and "torch" in run.message
    assert not HealthEvent.objects.exists()


def test_a_result_for_another_nodes_run_is_refused_and_a_late_one_changes_nothing(node, cluster):
    other = NodeFactory(cluster=cluster)
    run, _ = do_request_check(node, "nvml_sanity")
    assert do_record_check_result(other, run_id=run.pk, status="passed") is None

    agent_work.expire_work(CHECK_RUNS, now=run.deadline_at)
    do_record_check_result(node, run_id=run.pk, status="failed", message="late")
    run.refresh_from_db()
    assert run.status == CheckRun.Status.TIMED_OUT and run.message.startswith("no result in time")
    assert not HealthEvent.objects.exists()


def test_runs_past_their_deadline_time_out_and_say_why(node):
    now = timezone.now()
    offline, _ = do_request_check(node, "nvml_sanity", now=now)
    sent, _ = do_request_check(node, "storage", now=now)
    CheckRun.objects.filter(pk=sent.pk).update(status="running", sent_at=now)
    assert agent_work.expire_work(CHECK_RUNS, now=now + timedelta(seconds=119)) == 0
    assert agent_work.expire_work(CHECK_RUNS, now=now + timedelta(seconds=900)) == 2
    offline.refresh_from_db()
    sent.refresh_from_db()
    assert offline.message == "no result in time: the node's agent was not connected"
    assert sent.message == "no result in time: the agent did not answer"


def pass_all(node, purpose):
    for run in CheckRun.objects.unfinished().filter(node=node, purpose=purpose):
        do_record_check_result(node, run_id=run.pk, status="passed")


def test_acceptance_holds_a_new_node_pending_until_the_battery_passes(cluster):
    cluster.acceptance_tests_enabled = True
    cluster.save()
    node = do_register_node(cluster, "gpu-002")
    assert node.acceptance_required
    say_hello(node, boot_id="boot-1", gpus=HELLO_GPUS)
    start_checks_after_hello(node, rebooted=True)
    runs = CheckRun.objects.filter(node=node, purpose="acceptance")
    assert sorted(runs.values_list("check_name", flat=True)) == sorted(ACCEPTANCE_CHECKS)
    node.refresh_from_db()
    assert (node.state, node.state_reason) == (NodeState.PENDING, "running acceptance tests")

    start_checks_after_hello(node, rebooted=False)  # a reconnect starts no second battery
    assert runs.count() == len(ACCEPTANCE_CHECKS)

    compute = runs.get(check_name="gpu_compute")
    do_record_check_result(node, run_id=compute.pk, status="failed", message="GPU 3 slow")
    for run in runs.exclude(pk=compute.pk):
        do_record_check_result(node, run_id=run.pk, status="passed")
    node.refresh_from_db()
    assert node.state == NodeState.PENDING
    assert node.state_reason == "acceptance tests did not pass: gpu_compute failed"
    assert node.acceptance_passed_at is None

    rerun, _ = do_request_check(node, "gpu_compute", purpose="acceptance")
    do_record_check_result(node, run_id=rerun.pk, status="passed")
    node.refresh_from_db()
    assert node.acceptance_passed_at is not None and node.state != NodeState.PENDING


def test_turning_acceptance_on_leaves_nodes_that_already_joined_alone(node, cluster):
    cluster.acceptance_tests_enabled = True
    cluster.save()
    start_checks_after_hello(node, rebooted=False)
    assert not CheckRun.objects.exists()
    node.refresh_from_db()
    assert node.state != NodeState.PENDING


def test_a_reboot_that_passes_its_checks_closes_the_xids_from_before_it(node):
    gpu = node.gpus.get(index=3)
    before = timezone.now() - timedelta(minutes=5)
    xid = do_record_health_event(node, signature="xid:79", severity="critical", gpu=gpu,
                                 message="GPU has fallen off the bus", now=before)
    heartbeat = do_record_health_event(node, signature="heartbeat_lost", severity="critical",
                                       now=before)
    say_hello(node, boot_id="boot-2", gpus=HELLO_GPUS)
    start_checks_after_hello(node, rebooted=True)
    runs = CheckRun.objects.filter(node=node, purpose="after_reboot")
    assert sorted(runs.values_list("check_name", flat=True)) == sorted(AFTER_REBOOT_CHECKS)
    assert set(runs.values_list("boot_id", flat=True)) == {"boot-2"}
    node.refresh_from_db()
    assert node.state == NodeState.BOOTING

    pass_all(node, "after_reboot")
    xid.refresh_from_db()
    heartbeat.refresh_from_db()
    assert not xid.is_open
    assert xid.closed_reason == "rebooted and passed nvml_sanity, gpu_compute"
    assert heartbeat.is_open  # a held signal closes when it ends, not at a reboot


def test_a_reboot_whose_checks_fail_keeps_the_xids_open(node):
    xid = do_record_health_event(node, signature="xid:79", severity="critical",
                                 gpu=node.gpus.get(index=3), now=timezone.now() - timedelta(1))
    say_hello(node, boot_id="boot-2", gpus=HELLO_GPUS)
    start_checks_after_hello(node, rebooted=True)
    sanity = CheckRun.objects.get(node=node, check_name="nvml_sanity")
    do_record_check_result(node, run_id=sanity.pk, status="failed",
                           message="7 GPUs present, 8 expected")
    pass_all(node, "after_reboot")
    xid.refresh_from_db()
    node.refresh_from_db()
    assert xid.is_open and node.state == NodeState.UNHEALTHY


def test_a_reboot_without_open_xids_runs_no_checks(node):
    say_hello(node, boot_id="boot-2", gpus=HELLO_GPUS)
    start_checks_after_hello(node, rebooted=True)
    assert not CheckRun.objects.exists()


def test_a_node_of_unknown_gpus_gets_no_thresholds(cluster):
    node = NodeFactory(cluster=cluster)
    GpuFactory(node=node, name="NVIDIA B200")
    run, _ = do_request_check(node, "gpu_compute")
    assert run.params == {}
    assert Node.objects.get(pk=node.pk).check_runs.count() == 1


def test_a_reboot_that_passes_leaves_a_gpu_still_missing_from_the_hello_lost(node):
    seven = [gpu for gpu in HELLO_GPUS if gpu["index"] != 3]
    say_hello(node, boot_id="boot-2", gpus=seven)  # GPU 3 missing: gpu_lost opens
    lost = HealthEvent.objects.get(signature="gpu_lost")
    HealthEvent.objects.filter(pk=lost.pk).update(first_seen=timezone.now() - timedelta(1))
    say_hello(node, boot_id="boot-3", gpus=seven)
    start_checks_after_hello(node, rebooted=True)
    assert CheckRun.objects.filter(purpose="after_reboot").count() == 2
    sanity = CheckRun.objects.get(check_name="nvml_sanity")
    assert sanity.params["expected_gpus"] == 8  # the inventory, not the hello
    pass_all(node, "after_reboot")
    lost.refresh_from_db()
    assert lost.is_open
