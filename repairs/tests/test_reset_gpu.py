"""The reset_gpu repair (DESIGN.md "Repairs"): one GPU reset by its node's agent, after a
drain (the scheduler cannot take one GPU out of service), verified by fresh checks, with the
Xids of that GPU closed; refused by the agent ("busy", or a topology that does not allow it),
it changes nothing, lifts its drain, starts no cooldown, and the ladder climbs to a reboot
at once. The job_leftovers ladder: clean up, then reset_gpu, then reboot."""

from datetime import timedelta

import pytest
from django.utils import timezone

from healthchecks.models import CheckRun, HealthEvent
from healthchecks.services import do_record_check_result, do_record_health_event
from nodes.choices import NodeState
from nodes.models import AgentCommand
from nodes.services import do_record_command_result, do_record_hello, do_register_node
from repairs import steps
from repairs.choices import Action, Status
from repairs.policy import in_cooldown
from repairs.services import do_approve_repair, refresh_recommendation

from .helpers import past_the_bundle

pytestmark = pytest.mark.django_db

GPUS = [{"index": i, "uuid": f"GPU-{i:04d}", "name": "NVIDIA H200", "serial": f"16541{i:08d}",
         "pci_bus_id": f"00000000:{i + 6:02X}:00.0", "memory_total_bytes": 150754820096}
        for i in range(8)]


@pytest.fixture
def node(cluster, settings):
    settings.CLUSTERUI_BOOT_WINDOW_S = 0
    node = do_register_node(cluster, "gpu-021")
    do_record_hello(node, boot_id="boot-1", gpus=GPUS)
    node.refresh_from_db()
    return node


def xid_119(node, gpu=4):
    return do_record_health_event(node, signature="xid:119", severity="critical",
                                  gpu=node.gpus.get(index=gpu),
                                  message="Timeout after 6s of waiting for RPC response from "
                                          "GPU4 GSP")


def answer(node, status, message=""):
    command = AgentCommand.objects.get(node=node, action="reset_gpu")
    do_record_command_result(node, command_id=command.pk, status=status, message=message)
    return command


def test_a_reset_gpu_bucket_xid_is_reset_alone_verified_and_closed(node, operator, enqueued):
    event = xid_119(node)
    repair = refresh_recommendation(node)
    assert repair.action == Action.RESET_GPU and repair.gpu.index == 4
    assert repair.reason.startswith("NVIDIA: reset the GPU (RESET_GPU)")
    repair = do_approve_repair(repair, actor=operator)
    assert list(repair.steps.values_list("kind", flat=True)) == [
        "drain", "collect_bundle", "act", "verify", "resume"]
    node.refresh_from_db()
    assert node.state == NodeState.PAUSED  # it takes the node out, as a reboot does

    now = timezone.now()
    steps.run_step(enqueued.pop(0), now=now)  # drain: no scheduler here
    past_the_bundle(enqueued, now=now)
    steps.run_step(enqueued.pop(0), now=now)  # act: the command goes out
    command = AgentCommand.objects.get(node=node, action="reset_gpu")
    assert command.params == {"gpu_uuid": "GPU-0004"}
    answer(node, "accepted")
    act = repair.steps.get(kind="act")
    act.refresh_from_db()
    later = act.next_check_at
    steps.run_due_steps(now=later)
    assert "is accepted" in steps.run_step(enqueued.pop(0), now=later).message  # not done yet
    answer(node, "ok", "GPU 4 (GPU-0004) reset and answers NVML again")
    act.refresh_from_db()
    later = act.next_check_at
    steps.run_due_steps(now=later)
    assert steps.run_step(enqueued.pop(0), now=later).message == (
        f"the agent carried out reset_gpu command #{command.pk}")
    steps.run_step(enqueued.pop(0), now=later)  # verify: fresh checks are asked
    runs = CheckRun.objects.filter(node=node, purpose=CheckRun.Purpose.AFTER_RESET)
    assert sorted(runs.values_list("check_name", flat=True)) == ["gpu_compute", "nvml_sanity"]
    for run in runs:
        do_record_check_result(node, run_id=run.pk, status="passed")
    later = repair.steps.get(kind="verify").next_check_at
    steps.run_due_steps(now=later)
    outcome = steps.run_step(enqueued.pop(0), now=later)
    assert outcome.message == "passed nvml_sanity, gpu_compute; closed xid:119"
    steps.run_step(enqueued.pop(0), now=later)  # resume
    repair.refresh_from_db()
    assert repair.status == Status.SUCCEEDED
    assert HealthEvent.objects.get(pk=event.pk).closed_at is not None
    assert not AgentCommand.objects.filter(action="reboot").exists()


def refused_reset(node, operator, enqueued, message):
    reset = do_approve_repair(refresh_recommendation(node), actor=operator)
    now = timezone.now()
    steps.run_step(enqueued.pop(0), now=now)  # drain
    past_the_bundle(enqueued, now=now)
    steps.run_step(enqueued.pop(0), now=now)  # act
    answer(node, "failed", message)
    later = reset.steps.get(kind="act").next_check_at
    steps.run_due_steps(now=later)
    steps.run_step(enqueued.pop(0), now=later)
    reset.refresh_from_db()
    return reset, later


def test_a_refused_reset_changes_nothing_and_the_ladder_climbs_to_a_reboot_at_once(
        node, operator, enqueued):
    xid_119(node)
    reset, later = refused_reset(node, operator, enqueued,
                                 "refused: the fabric manager needs every GPU reset together")
    assert reset.status == Status.FAILED
    assert "refused: the fabric manager needs every GPU reset together" in reset.outcome
    node.refresh_from_db()
    assert not node.paused  # nothing was done to it
    assert not in_cooldown(node, later)
    reboot = refresh_recommendation(node, now=later)
    assert reboot.action == Action.REBOOT and reboot.follows == reset
    assert reboot.reason.startswith(f"xid:119 is still open after repair #{reset.pk} "
                                    f"(reset_gpu, failed): the next rung is reboot")


def test_job_leftovers_climb_clean_up_then_reset_then_reboot_when_a_process_survives(
        node, operator, enqueued):
    do_record_health_event(node, signature="job_leftovers", severity="warning",
                           gpu=node.gpus.get(index=2),
                           message="job 46076 ended; pid 5123 still holds 1024 MiB on GPU 2")
    cleanup = do_approve_repair(refresh_recommendation(node), actor=operator)
    assert cleanup.action == Action.CLEANUP
    now = timezone.now()
    steps.run_step(enqueued.pop(0), now=now)
    command = AgentCommand.objects.get(node=node, action="cleanup")
    do_record_command_result(node, command_id=command.pk, status="ok",
                             message="pid 5123 did not end on SIGTERM nor SIGKILL (D state)")
    later = now + timedelta(seconds=6)
    steps.run_due_steps(now=later)
    steps.run_step(enqueued.pop(0), now=later)  # act done
    steps.run_step(enqueued.pop(0), now=later)  # verify: still open, it waits
    past = later + steps.SIGNAL_CLOSES_WITHIN + timedelta(minutes=1)
    steps.run_due_steps(now=past)
    steps.run_step(enqueued.pop(0), now=past)  # verify: still open past its limit
    cleanup.refresh_from_db()
    assert cleanup.status == Status.FAILED

    reset = refresh_recommendation(node, now=past)
    assert reset.action == Action.RESET_GPU and reset.follows == cleanup
    enqueued.clear()
    reset, later = refused_reset(node, operator, enqueued, "busy: pid 5123 holds the GPU")
    assert reset.status == Status.FAILED and "busy: pid 5123 holds the GPU" in reset.outcome
    reboot = refresh_recommendation(node, now=later)
    assert reboot.action == Action.REBOOT and reboot.follows == reset


def test_a_node_level_signal_skips_the_gpu_rung(node):
    do_record_health_event(node, signature="job_leftovers", severity="warning",
                           message="job 46076 left /dev/shm/nccl-* behind")
    assert refresh_recommendation(node).action == Action.CLEANUP
    from repairs.policy import choose_action

    event = HealthEvent.objects.get(signature="job_leftovers")
    assert choose_action(event, {}, timezone.now()).ladder == ("cleanup", "reboot")
