"""The reconfigure repair (gres_drift): recommended from the policy, act -> verify without a
drain or a reboot, the agent's `ok` and its closing of gres_drift deciding each step, and a
second drift within 7 days escalating to a reboot."""

from datetime import timedelta

import pytest
from django.utils import timezone

from healthchecks.choices import Severity
from healthchecks.services import do_close_health_event, do_record_health_event
from nodes.choices import NodeState
from nodes.models import AgentCommand
from nodes.services import do_record_command_result, do_record_hello, do_register_node
from repairs import steps
from repairs.choices import Status, StepStatus
from repairs.forms import RepairPolicyForm
from repairs.models import Repair
from repairs.services import do_approve_repair, refresh_recommendation

pytestmark = pytest.mark.django_db

GPUS = [{"index": i, "uuid": f"GPU-{i:04d}", "name": "NVIDIA H200",
         "pci_bus_id": f"00000000:{i + 6:02X}:00.0", "memory_total_bytes": 150754820096}
        for i in range(8)]
DRIFT = "Slurm's view of gpu-011's GPUs differs from the hardware: gres.conf names 7, NVML sees 8"


@pytest.fixture
def node(cluster, settings):
    settings.CLUSTERUI_BOOT_WINDOW_S = 0
    node = do_register_node(cluster, "gpu-011")
    do_record_hello(node, boot_id="boot-1", gpus=GPUS)
    node.refresh_from_db()
    return node


def drift(node):
    return do_record_health_event(node, signature="gres_drift", severity=Severity.WARNING,
                                  message=DRIFT, evidence={"problems": ["7 in Slurm, 8 in NVML"]})


def run_next(enqueued, now=None):
    return steps.run_step(enqueued.pop(0), now=now)


def test_gres_drift_is_repaired_by_reconfigure_without_a_drain_or_a_reboot(node, operator,
                                                                          enqueued):
    event = drift(node)
    repair = refresh_recommendation(node)
    assert repair.action == "reconfigure" and repair.signature == "gres_drift"
    assert repair.reason.startswith("The reconfigure rebuilds Slurm's list of GPUs")
    repair = do_approve_repair(repair, actor=operator)
    assert list(repair.steps.order_by("position").values_list("kind", flat=True)) == [
        "act", "verify"]

    outcome = run_next(enqueued)
    command = AgentCommand.objects.get(node=node)
    assert command.action == "reconfigure" and outcome.message == (
        f"reconfigure command #{command.pk} sent to the agent")
    act_step = repair.steps.get(kind="act")
    do_record_command_result(node, command_id=command.pk, status="accepted")
    act_step.refresh_from_db()
    later = act_step.next_check_at  # when beat checks it again
    steps.run_due_steps(now=later)
    assert "is accepted" in run_next(enqueued, now=later).message  # a reboot would be done here
    do_record_command_result(node, command_id=command.pk, status="ok",
                             message="gres.conf: gpu-011 has 8 GPUs; Gres=gpu:8; matches")
    act_step.refresh_from_db()
    later = act_step.next_check_at
    steps.run_due_steps(now=later)
    outcome = run_next(enqueued, now=later)
    assert outcome.message == f"the agent carried out reconfigure command #{command.pk}"
    act_step.refresh_from_db()
    assert act_step.output.endswith("matches")

    outcome = run_next(enqueued, now=later)  # verify: gres_drift still open
    assert isinstance(outcome, steps.Wait)
    do_close_health_event(event, reason="cleared by the agent")
    later = repair.steps.get(kind="verify").next_check_at
    steps.run_due_steps(now=later)
    assert run_next(enqueued, now=later).message == (
        "Slurm's view of the GPUs matches the hardware")
    repair.refresh_from_db()
    node.refresh_from_db()
    assert repair.status == Status.SUCCEEDED
    assert repair.outcome == "repaired: Slurm's GPU view rebuilt from the hardware, and verified"
    assert node.state == NodeState.HEALTHY
    assert not AgentCommand.objects.filter(action="reboot").exists()


def test_a_failed_reconfigure_fails_the_repair_with_the_agents_reason(node, operator, enqueued):
    drift(node)
    repair = do_approve_repair(refresh_recommendation(node), actor=operator)
    run_next(enqueued)
    command = AgentCommand.objects.get(node=node)
    do_record_command_result(node, command_id=command.pk, status="failed",
                             message="scontrol update NodeName=gpu-011 Gres=gpu:8: Invalid "
                                     "generic resource (gres) specification")
    later = timezone.now() + timedelta(seconds=6)
    steps.run_due_steps(now=later)
    run_next(enqueued, now=later)
    repair.refresh_from_db()
    assert repair.status == Status.FAILED
    assert "Invalid generic resource" in repair.outcome
    node.refresh_from_db()
    assert node.state != NodeState.PAUSED  # a reconfigure leaves the node in service
    following = refresh_recommendation(node, now=later)  # no cooldown: the next rung at once
    assert following.action == "reboot" and following.follows_id == repair.pk
    assert following.reason.startswith(f"gres_drift is still open after repair #{repair.pk} "
                                       f"(reconfigure, failed): the next rung is reboot")


def test_verify_fails_when_gres_drift_stays_open(node, operator, enqueued):
    drift(node)
    repair = do_approve_repair(refresh_recommendation(node), actor=operator)
    run_next(enqueued)
    command = AgentCommand.objects.get(node=node)
    do_record_command_result(node, command_id=command.pk, status="ok", message="done")
    later = timezone.now() + timedelta(seconds=6)
    steps.run_due_steps(now=later)
    run_next(enqueued, now=later)
    verify = repair.steps.get(kind="verify")
    assert isinstance(run_next(enqueued, now=later), steps.Wait)
    much_later = later + steps.SIGNAL_CLOSES_WITHIN + timedelta(minutes=1)
    steps.run_due_steps(now=much_later)
    outcome = run_next(enqueued, now=much_later)
    assert isinstance(outcome, steps.Failed) and "gres_drift is still open 5 min" in outcome.message
    verify.refresh_from_db()
    assert verify.status == StepStatus.FAILED


def test_drift_again_within_7_days_of_a_reconfigure_escalates_to_a_reboot(node, operator):
    now = timezone.now()
    Repair.objects.create(cluster=node.cluster, node=node, action="reconfigure",
                          signature="gres_drift", reason="gres_drift",
                          status=Status.SUCCEEDED, requested_at=now - timedelta(days=2),
                          started_at=now - timedelta(days=2),
                          finished_at=now - timedelta(days=2))
    drift(node)
    repair = refresh_recommendation(node, now=now)
    assert repair.action == "reboot"
    assert repair.reason.startswith("gres_drift came back 2 days after repair #")


@pytest.mark.parametrize("signature, valid", [("gres_drift", True), ("xid:79", False)])
def test_reconfigure_is_a_policy_for_gres_drift_only(signature, valid):
    form = RepairPolicyForm({"signature": signature, "action": "reconfigure"})
    assert form.is_valid() is valid
    if not valid:
        assert form.errors["action"] == ["reconfigure repairs gres_drift only."]
