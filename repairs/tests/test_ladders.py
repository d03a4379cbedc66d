"""Ladders (DESIGN.md "Repairs"): the lightest rung first; a clean-up is a repair like the
others but leaves the node in service (no pause, no blast-radius count, no cooldown), so
the next rung follows at once when it does not fix the signal."""

from datetime import timedelta

import pytest
from django.utils import timezone

from healthchecks.services import do_close_health_event, do_record_health_event
from healthchecks.signatures import SIGNATURES
from healthchecks.xid_catalog import bucket_rules
from nodes.choices import NodeState
from nodes.models import AgentCommand
from nodes.services import do_pause_node, do_record_command_result
from nodes.tests.factories import GpuFactory, NodeFactory
from repairs import steps
from repairs.choices import ACTIONS_BY_COST, Action, Status
from repairs.models import RepairSettings
from repairs.policy import in_cooldown
from repairs.services import do_approve_repair, refresh_recommendation

pytestmark = pytest.mark.django_db


@pytest.fixture
def node(cluster):
    node = NodeFactory(cluster=cluster, name="gpu-021", state=NodeState.UNHEALTHY)
    for index in range(8):
        GpuFactory(node=node, index=index)
    return node


def leftovers(node, signature="job_leftovers", gpu=2):
    return do_record_health_event(
        node, signature=signature, severity="warning",
        gpu=node.gpus.get(index=gpu) if gpu is not None else None,
        message="job 46076 ended; pid 5123 still holds 1024 MiB on GPU 2")


def run_next(enqueued, now=None):
    return steps.run_step(enqueued.pop(0), now=now)


def test_every_ladder_is_made_of_repair_actions_cheapest_first():
    ladders = [info.ladder for info in SIGNATURES.values()]
    ladders += [rule.ladder for rule in bucket_rules().values()]
    for ladder in ladders:
        assert set(ladder) <= set(Action.values), ladder
        assert list(ladder) == sorted(ladder, key=ACTIONS_BY_COST.index), ladder


@pytest.mark.parametrize("signature", ["job_leftovers", "zombie_processes", "pid_pressure"])
def test_leftovers_zombies_and_pid_pressure_are_cleaned_up_first(node, signature):
    leftovers(node, signature, gpu=2 if signature == "job_leftovers" else None)
    repair = refresh_recommendation(node)
    assert repair.action == Action.CLEANUP
    assert "the node stays in service" in repair.reason


def test_a_clean_up_runs_without_a_drain_or_a_pause_and_past_the_blast_radius(
        cluster, node, operator, enqueued):
    RepairSettings.objects.create(cluster=cluster, blast_radius_pct=10)
    other = NodeFactory(cluster=cluster, name="gpu-022")
    do_pause_node(other, actor=operator, reason="reseating")  # the one node the limit allows
    event = leftovers(node)
    repair = do_approve_repair(refresh_recommendation(node), actor=operator)
    assert repair.status == Status.RUNNING  # a clean-up counts toward no limit
    assert list(repair.steps.values_list("kind", flat=True)) == ["act", "verify"]
    node.refresh_from_db()
    assert node.state != NodeState.PAUSED

    run_next(enqueued)
    command = AgentCommand.objects.get(node=node)
    assert command.action == "cleanup"
    do_record_command_result(node, command_id=command.pk, status="ok",
                             message="ended pid 5123 (job 46076)")
    later = timezone.now() + timedelta(seconds=6)
    steps.run_due_steps(now=later)
    assert run_next(enqueued, now=later).message.startswith("the agent carried out cleanup")
    do_close_health_event(event, reason="cleared by the agent")
    steps.run_due_steps(now=later)
    assert run_next(enqueued, now=later).message == "the agent finds nothing left behind"
    repair.refresh_from_db()
    assert repair.status == Status.SUCCEEDED
    assert not in_cooldown(node, later)  # the next rung could follow at once


def test_memory_still_held_after_the_clean_up_climbs_to_the_next_rung_at_once(
        node, operator, enqueued):
    leftovers(node)
    cleanup = do_approve_repair(refresh_recommendation(node), actor=operator)
    run_next(enqueued)
    command = AgentCommand.objects.get(node=node)
    do_record_command_result(node, command_id=command.pk, status="ok", message="nothing to end")
    later = timezone.now() + timedelta(seconds=6)
    steps.run_due_steps(now=later)
    run_next(enqueued, now=later)
    steps.run_due_steps(now=later)
    run_next(enqueued, now=later)  # verify: still open, it waits
    past = later + steps.SIGNAL_CLOSES_WITHIN + timedelta(minutes=1)
    steps.run_due_steps(now=past)
    outcome = run_next(enqueued, now=past)
    assert outcome.message.startswith("job_leftovers is still open 5 min after the cleanup")
    cleanup.refresh_from_db()
    node.refresh_from_db()
    assert cleanup.status == Status.FAILED and node.state != NodeState.PAUSED

    following = refresh_recommendation(node, now=past)
    assert following.action == Action.RESET_GPU and following.follows == cleanup
    assert following.follows_why == (f"job_leftovers is still open after repair #{cleanup.pk} "
                                     f"(cleanup, failed)")
    assert "the next rung is reset_gpu, the agent resets this one GPU" in following.reason


def test_a_cluster_row_sets_the_first_rung_and_the_default_ladder_goes_on(cluster, node, admin):
    from repairs.services import do_set_repair_policy

    do_set_repair_policy(cluster, "xid:79", action="reprovision", auto_approve=False,
                         actor=admin)
    do_record_health_event(node, signature="xid:79", severity="critical",
                           gpu=node.gpus.get(index=1), message="fallen off the bus")
    repair = refresh_recommendation(node)
    assert repair.action == "reprovision"
    assert repair.reason.startswith("This cluster's policy starts xid:79 at reprovision (set "
                                    "by ada)")


@pytest.mark.parametrize("signature, evidence, action, words", [
    ("xid:154", {"recovery_action": 2, "recovery_action_text": "Node Reboot Required"},
     "reboot", "The driver asks: reboot the node: the fault may have left the OS "
               "inconsistent (NODE_REBOOT)."),
    ("gpu_recovery_action", {"action": 4, "action_name": "DRAIN_AND_RESET"}, "reset_gpu",
     "The driver asks: stop the GPU's peer-to-peer traffic and reset it (DRAIN_AND_RESET)."),
    ("xid:154", {"recovery_action": 5}, None, ""),  # IMEX: an operator's
])
def test_the_recovery_action_an_event_names_chooses_its_repair(node, signature, evidence,
                                                               action, words):
    do_record_health_event(node, signature=signature, severity="critical",
                           gpu=node.gpus.get(index=0), message="GPU recovery action changed",
                           evidence=evidence)
    repair = refresh_recommendation(node)
    if action is None:
        assert repair is None
    else:
        assert repair.action == action and repair.reason.startswith(words)


def test_an_xid_74_says_which_nvlink(node):
    line = ("NVRM: Xid (PCI:0000:8b:00): 74, pid=2270, name=python3, NVLink: fatal error "
            "detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)")
    do_record_health_event(node, signature="xid:74", severity="critical",
                           gpu=node.gpus.get(index=5), message="NVLink error",
                           evidence={"kernel_line": line})
    assert refresh_recommendation(node).reason.endswith("The error is on NVLink 14.")


def test_every_recovery_action_of_nvml_has_a_row():
    from healthchecks.xid_catalog import recovery_actions

    assert sorted(recovery_actions()) == list(range(8))
    for recovery in recovery_actions().values():
        assert set(recovery.ladder) <= set(Action.values) and recovery.why.endswith(".")
