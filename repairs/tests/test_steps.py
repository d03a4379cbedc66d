"""The step engine, step by step, called directly (the Celery wrapper holds no logic):
drain -> collect the bundle -> act -> wait for the node -> verify -> resume, waiting without sleeping, failing
with a reason, and running a step twice without doing anything twice."""

from datetime import timedelta

import pytest
from django.utils import timezone

from healthchecks.models import CheckRun, HealthEvent
from healthchecks.services import do_record_check_result, do_record_health_event
from nodes.choices import NodeState
from nodes.models import AgentToken
from nodes.services import do_record_hello, do_register_node, hash_token, rejoin_opening
from repairs import steps
from repairs.choices import Status, StepStatus
from repairs.models import RepairSettings
from repairs.services import do_approve_repair, do_propose_repair, refresh_recommendation

from .helpers import past_the_bundle

pytestmark = pytest.mark.django_db

GPUS = [{"index": i, "uuid": f"GPU-{i:04d}", "name": "NVIDIA H200",
         "pci_bus_id": f"00000000:{i + 6:02X}:00.0", "memory_total_bytes": 150754820096}
        for i in range(8)]



@pytest.fixture
def node(cluster, settings, tmp_path):
    settings.CLUSTERUI_BOOT_WINDOW_S = 0
    RepairSettings.objects.create(
        cluster=cluster, provider="command", provider_commands={
            "reprovision": f"echo reprovisioning {{node}} >> {tmp_path}/calls",
            "remove": f"echo removing {{node}} >> {tmp_path}/calls"})
    node = do_register_node(cluster, "gpu-009")
    do_record_hello(node, boot_id="boot-1", gpus=GPUS)
    node.refresh_from_db()
    return node


def run_next(enqueued, now=None):
    return steps.run_step(enqueued.pop(0), now=now)


def test_a_reprovision_runs_every_step_and_the_node_ends_healthy(node, operator, enqueued,
                                                                  tmp_path):
    repair = do_approve_repair(
        do_propose_repair(node, action="reprovision", actor=operator, reason="bad image"),
        actor=operator)
    assert repair.status == Status.RUNNING and repair.boot_id_before == "boot-1"
    node.refresh_from_db()
    assert node.state == NodeState.PAUSED

    assert run_next(enqueued).message == "nothing to drain: no scheduler configured"
    past_the_bundle(enqueued)
    assert "started by the provider" in run_next(enqueued).message
    assert (tmp_path / "calls").read_text() == "reprovisioning gpu-009\n"

    wait_step = repair.steps.get(kind="wait_for_node")
    outcome = run_next(enqueued)
    assert isinstance(outcome, steps.Wait) and not enqueued  # re-checked by beat, not a sleep
    assert steps.run_step(wait_step.pk) is None  # not due yet
    do_record_hello(node, boot_id="boot-2", gpus=GPUS)
    wait_step.refresh_from_db()
    later = wait_step.next_check_at  # when beat checks it again
    assert steps.run_due_steps(now=later) == 1
    assert run_next(enqueued, now=later).message.startswith("back with a new boot id")

    assert isinstance(run_next(enqueued), steps.Wait)  # verify asked for its checks
    runs = CheckRun.objects.filter(node=node, purpose="after_reboot", boot_id="boot-2")
    assert sorted(runs.values_list("check_name", flat=True)) == ["gpu_compute", "nvml_sanity"]
    for run in runs:
        do_record_check_result(node, run_id=run.pk, status="passed")
    verify_step = repair.steps.get(kind="verify")
    later = verify_step.next_check_at
    steps.run_due_steps(now=later)
    assert run_next(enqueued, now=later).message == "passed nvml_sanity, gpu_compute"
    assert run_next(enqueued).message == "nothing to resume: no scheduler configured"

    repair.refresh_from_db()
    node.refresh_from_db()
    assert repair.status == Status.SUCCEEDED and repair.finished_at
    assert node.state == NodeState.HEALTHY
    assert set(repair.steps.values_list("status", flat=True)) == {StepStatus.DONE}
    assert verify_step.pk in [s.pk for s in repair.steps.all()]


def test_a_failed_verify_fails_the_repair_and_leaves_the_node_paused(node, operator, enqueued):
    repair = do_approve_repair(
        do_propose_repair(node, action="reprovision", actor=operator, reason="bad image"),
        actor=operator)
    run_next(enqueued)
    past_the_bundle(enqueued)
    run_next(enqueued)
    do_record_hello(node, boot_id="boot-2", gpus=GPUS)
    run_next(enqueued)
    run_next(enqueued)
    sanity = CheckRun.objects.get(node=node, check_name="nvml_sanity")
    do_record_check_result(node, run_id=sanity.pk, status="failed",
                           message="7 GPUs present, 8 expected")
    compute = CheckRun.objects.get(node=node, check_name="gpu_compute")
    do_record_check_result(node, run_id=compute.pk, status="passed")
    later = timezone.now() + timedelta(seconds=6)
    steps.run_due_steps(now=later)
    outcome = run_next(enqueued, now=later)
    assert isinstance(outcome, steps.Failed) and "7 GPUs present" in outcome.message

    repair.refresh_from_db()
    node.refresh_from_db()
    assert repair.status == Status.FAILED
    assert repair.outcome.startswith("verify failed: nvml_sanity failed")
    assert node.paused and node.state == NodeState.PAUSED
    assert node.state_reason.startswith(f"repair #{repair.pk} failed")
    assert repair.steps.get(kind="resume").status == StepStatus.PENDING


def test_a_provider_failure_fails_the_step_with_its_output(node, operator, enqueued, cluster):
    RepairSettings.objects.filter(cluster=cluster).update(
        provider_commands={"reprovision": "echo no capacity in rack 4 >&2; exit 3"})
    repair = do_approve_repair(
        do_propose_repair(node, action="reprovision", actor=operator, reason="x"),
        actor=operator)
    run_next(enqueued)
    past_the_bundle(enqueued)
    outcome = run_next(enqueued)
    assert isinstance(outcome, steps.Failed) and "no capacity in rack 4" in outcome.message
    repair.refresh_from_db()
    assert repair.status == Status.FAILED


def test_an_act_step_run_again_after_its_worker_died_does_not_act_twice(node, operator, enqueued,
                                                                       tmp_path):
    repair = do_approve_repair(
        do_propose_repair(node, action="remove", actor=operator, reason="RMA"), actor=operator)
    run_next(enqueued)
    past_the_bundle(enqueued)
    act = repair.steps.get(kind="act")
    assert run_next(enqueued).message == "remove started by the provider"
    assert steps.run_step(act.pk) is None  # done: a second delivery does nothing
    assert (tmp_path / "calls").read_text() == "removing gpu-009\n"
    repair.refresh_from_db()
    node.refresh_from_db()
    assert repair.status == Status.SUCCEEDED
    assert node.paused and node.paused_reason == f"removed from the pool for RMA (repair #{repair.pk})"


def test_a_provider_run_cut_short_is_not_repeated(node, operator, enqueued, tmp_path):
    repair = do_approve_repair(
        do_propose_repair(node, action="remove", actor=operator, reason="RMA"), actor=operator)
    run_next(enqueued)
    past_the_bundle(enqueued)
    act = repair.steps.get(kind="act")
    steps.set_details(act, provider_started=timezone.now().isoformat())  # died mid-run
    outcome = run_next(enqueued)
    assert isinstance(outcome, steps.Failed) and "was interrupted" in outcome.message
    assert not (tmp_path / "calls").exists()


def test_an_xid_79_repair_recommended_approved_and_verified_closes_the_xid(node, operator,
                                                                          enqueued, cluster):
    RepairSettings.objects.filter(cluster=cluster).update(
        provider_commands={"reprovision": "true"})
    xid = do_record_health_event(node, signature="xid:79", severity="critical",
                                 gpu=node.gpus.get(index=3), message="fallen off the bus",
                                 now=timezone.now() - timedelta(minutes=1))
    repair = refresh_recommendation(node)
    assert repair.action == "reboot"
    # An operator prefers a reprovision here; the reboot path needs the agent (integration).
    repair.action = "reprovision"
    repair.save(update_fields=["action"])
    do_approve_repair(repair, actor=operator)
    run_next(enqueued)
    past_the_bundle(enqueued)
    run_next(enqueued)
    do_record_hello(node, boot_id="boot-2", gpus=GPUS)
    run_next(enqueued)
    run_next(enqueued)
    for run in CheckRun.objects.filter(node=node, boot_id="boot-2"):
        do_record_check_result(node, run_id=run.pk, status="passed")
    xid.refresh_from_db()
    assert not xid.is_open and xid.closed_reason.startswith("rebooted and passed")
    assert not HealthEvent.objects.open().filter(node=node).exists()


def test_a_step_whose_enqueue_was_lost_is_run_by_the_beat(node, operator, enqueued):
    repair = do_approve_repair(
        do_propose_repair(node, action="remove", actor=operator, reason="RMA"), actor=operator)
    enqueued.clear()  # the message for the first step never reached a worker
    assert steps.run_due_steps(now=timezone.now() + timedelta(seconds=30)) == 0
    assert steps.run_due_steps(now=timezone.now() + timedelta(seconds=61)) == 1
    assert enqueued == [repair.steps.get(position=0).pk]


def test_a_reprovision_opens_its_node_to_rejoin_and_hands_the_provider_a_token_for_it(
        node, operator, enqueued, tmp_path, cluster):
    """The new machine comes back with a join token: the provider's {join_token} is a fresh
    single-use token that re-joins only this node, shown nowhere, and the node is open to
    re-join until the repair ends."""
    RepairSettings.objects.filter(cluster=cluster).update(provider_commands={
        "reprovision": f"echo {{join_token}} > {tmp_path}/token; echo deploying with "
                       f"{{join_token}}"})
    repair = do_approve_repair(
        do_propose_repair(node, action="reprovision", actor=operator, reason="bad image"),
        actor=operator)
    run_next(enqueued)  # drain
    past_the_bundle(enqueued)
    outcome = run_next(enqueued)
    plaintext = (tmp_path / "token").read_text().strip()
    assert plaintext.startswith("cuj_")
    assert plaintext not in outcome.output and "deploying with <join token>" in outcome.output
    assert "echo '<join token>'" not in outcome.output and "<join token>" in outcome.output
    token = AgentToken.objects.get(token_hash=hash_token(plaintext))
    assert (token.single_use, token.for_node_id, token.kind) == (True, node.pk, "join")
    node.refresh_from_db()
    assert rejoin_opening(node, timezone.now()).startswith(f"opened by repair #{repair.pk}")

    repair.refresh_from_db()
    steps.fail_repair(repair, "given up", timezone.now())
    node.refresh_from_db()
    assert node.rejoin_open_until is None and rejoin_opening(node, timezone.now()) is None


def test_a_reboot_does_not_open_its_node_to_rejoin(node, operator, enqueued):
    do_approve_repair(do_propose_repair(node, action="reboot", actor=operator, reason="xid"),
                      actor=operator)
    run_next(enqueued)  # drain
    past_the_bundle(enqueued)
    run_next(enqueued)  # the reboot command
    node.refresh_from_db()
    assert node.rejoin_open_until is None
    assert not AgentToken.objects.filter(kind="join", for_node=node).exists()
