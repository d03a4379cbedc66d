"""Recommendations: the policy and escalation table, one open repair per node, supersede,
cooldown, resolving by itself, auto-approve, approve / reject and the blast radius."""

from datetime import timedelta

import pytest
from django.utils import timezone

from clusters.models import AuditEntry
from healthchecks.services import do_close_health_event, do_record_health_event
from nodes.choices import NodeState
from nodes.services import do_pause_node
from nodes.tests.factories import GpuFactory, NodeFactory
from repairs.choices import Status
from repairs.models import Repair, RepairPolicy, RepairSettings
from repairs.services import (
    RepairRefused,
    do_approve_repair,
    do_propose_repair,
    do_reject_repair,
    refresh_recommendation,
    resolve_quiet_recommendations,
)
from repairs.tests.factories import RepairFactory
from repairs.transitions import Conflict

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_tasks")]

NOW = timezone.now()



@pytest.fixture
def node(cluster):
    node = NodeFactory(cluster=cluster, name="gpu-007")
    for index in range(8):
        GpuFactory(node=node, index=index)
    return node


def open_event(node, signature, *, gpu=3, severity="critical", at=NOW):
    gpu = node.gpus.get(index=gpu) if gpu is not None else None
    return do_record_health_event(node, signature=signature, severity=severity, gpu=gpu,
                                  message=signature, now=at)


@pytest.mark.parametrize("signature,severity,action", [
    ("xid:79", "critical", "reboot"),          # RESTART_BM
    ("xid:48", "critical", "reset_gpu"),       # DBE: NVIDIA's workflow resets the GPU
    ("xid:95", "critical", "reset_gpu"),       # uncontained ECC: RESET_GPU
    ("xid:54", "critical", "remove"),          # CHECK_MECHANICALS, applies to Hopper
    ("xid:31", "warning", None),               # an application's fault: no repair
    ("gpu_lost", "critical", "reboot"),
    ("slurm_drain", "warning", "reboot"),
    ("row_remap_failure", "critical", "remove"),
    ("check:gpu_compute", "warning", "reboot"),
    ("heartbeat_lost", "critical", None),      # the agent cannot reboot what it cannot reach
])
def test_the_default_policy(node, signature, severity, action):
    open_event(node, signature, severity=severity,
               gpu=None if signature in ("slurm_drain", "heartbeat_lost") else 3)
    repair = refresh_recommendation(node, now=NOW)
    if action is None:
        assert repair is None
    else:
        assert (repair.action, repair.status, repair.signature) == (action, "proposed", signature)
        assert repair.requested_by is None and repair.reason


def test_throttling_calls_for_failover_only_once_it_persists(node):
    open_event(node, "thermal_throttle", severity="warning", at=NOW)
    assert refresh_recommendation(node, now=NOW + timedelta(minutes=5)) is None
    repair = refresh_recommendation(node, now=NOW + timedelta(minutes=15))
    assert repair.action == "failover"


def test_the_clusters_policy_wins_over_the_default(node, cluster):
    RepairPolicy.objects.create(cluster=cluster, signature="xid:79", action="reprovision")
    RepairPolicy.objects.create(cluster=cluster, signature="gpu_lost", action="")
    open_event(node, "gpu_lost")
    assert refresh_recommendation(node, now=NOW) is None
    open_event(node, "xid:79")
    assert refresh_recommendation(node, now=NOW).action == "reprovision"


@pytest.mark.parametrize("last,expected", [
    ("reboot", "reprovision"), ("reprovision", "failover"), ("failover", "remove"),
    ("remove", "remove"),
])
def test_the_same_signature_within_7_days_of_a_repair_escalates_one_step(node, last, expected):
    RepairFactory(node=node, action=last, status=Status.SUCCEEDED, signature="xid:79",
                  started_at=NOW - timedelta(days=3), finished_at=NOW - timedelta(days=3))
    open_event(node, "xid:79")
    repair = refresh_recommendation(node, now=NOW)
    assert repair.action == expected and repair.follows is not None
    assert repair.reason.startswith(f"xid:79 came back 3 days after repair #{repair.follows.pk} ({last})")


def test_no_escalation_after_7_days_or_for_another_signature(node):
    RepairFactory(node=node, action="reboot", status=Status.SUCCEEDED, signature="xid:79",
                  started_at=NOW - timedelta(days=8), finished_at=NOW - timedelta(days=8))
    RepairFactory(node=node, action="reboot", status=Status.SUCCEEDED, signature="gpu_lost",
                  started_at=NOW - timedelta(days=1), finished_at=NOW - timedelta(days=1))
    open_event(node, "xid:79")
    assert refresh_recommendation(node, now=NOW).action == "reboot"


def test_one_open_repair_per_node_and_a_costlier_one_supersedes_it(node):
    open_event(node, "xid:79")
    first = refresh_recommendation(node, now=NOW)
    open_event(node, "gpu_lost", gpu=5)
    assert refresh_recommendation(node, now=NOW) == first  # as costly: joins the proposal
    assert first.events.count() == 2

    open_event(node, "row_remap_failure", gpu=2)
    costlier = refresh_recommendation(node, now=NOW)
    first.refresh_from_db()
    assert first.status == Status.SUPERSEDED and first.superseded_by == costlier
    assert costlier.action == "remove" and costlier.events.count() == 3
    assert Repair.objects.open().filter(node=node).count() == 1


def test_an_approved_or_running_repair_is_left_alone(node, operator):
    open_event(node, "xid:79")
    repair = refresh_recommendation(node, now=NOW)
    do_approve_repair(repair, actor=operator)
    open_event(node, "row_remap_failure", gpu=2)
    assert refresh_recommendation(node, now=NOW).pk == repair.pk
    assert Repair.objects.filter(node=node).count() == 1


def test_a_node_in_cooldown_gets_no_recommendation_but_its_events_stay_open(node):
    RepairFactory(node=node, status=Status.SUCCEEDED, started_at=NOW - timedelta(minutes=40),
                  finished_at=NOW - timedelta(minutes=10))
    event = open_event(node, "xid:79")
    assert refresh_recommendation(node, now=NOW) is None
    assert event.is_open
    assert refresh_recommendation(node, now=NOW + timedelta(minutes=21)) is not None


def test_a_proposal_resolves_itself_once_its_events_stayed_closed_for_5_minutes(node):
    event = open_event(node, "xid:79")
    repair = refresh_recommendation(node, now=NOW)
    do_close_health_event(event, reason="by hand", now=NOW + timedelta(minutes=1))
    assert resolve_quiet_recommendations(now=NOW + timedelta(minutes=5)) == 0
    assert resolve_quiet_recommendations(now=NOW + timedelta(minutes=6, seconds=1)) == 1
    repair.refresh_from_db()
    assert repair.status == Status.RESOLVED


def test_auto_approve_per_signature_approves_and_starts(node, cluster):
    RepairPolicy.objects.create(cluster=cluster, signature="xid:79", action="reboot",
                                auto_approve=True)
    open_event(node, "xid:79")
    repair = refresh_recommendation(node, now=NOW)
    assert repair.auto_approved and repair.status == Status.RUNNING
    assert list(repair.transitions.values_list("to_status", flat=True)) == ["approved", "running"]
    assert repair.transitions.first().actor_name == "system"


def test_two_operators_approve_once(node, operator, admin):
    open_event(node, "xid:79")
    repair = refresh_recommendation(node, now=NOW)
    stale = Repair.objects.get(pk=repair.pk)
    do_approve_repair(repair, actor=operator, comment="go")
    with pytest.raises(Conflict):
        do_approve_repair(stale, actor=admin)
    repair.refresh_from_db()
    assert repair.reviewed_by == operator and repair.status == Status.RUNNING
    assert repair.steps.count() == 6
    assert AuditEntry.objects.filter(action="repair.approve").count() == 1


def test_a_rejection_is_recorded_with_its_comment(node, operator):
    open_event(node, "xid:79")
    repair = do_reject_repair(refresh_recommendation(node, now=NOW), actor=operator,
                              comment="job finishing tonight")
    assert repair.status == Status.REJECTED and repair.review_comment == "job finishing tonight"
    assert AuditEntry.objects.get().changes == {"comment": "job finishing tonight",
                                                "snooze": "until its events close"}


def test_a_repair_proposed_by_hand_waits_for_approval_and_only_one_per_node(node, operator):
    repair = do_propose_repair(node, action="reprovision", actor=operator, reason="bad image")
    assert repair.status == Status.PROPOSED and repair.requested_by == operator
    with pytest.raises(RepairRefused, match="already has repair"):
        do_propose_repair(node, action="reboot", actor=operator, reason="again")


def test_the_blast_radius_holds_a_repair_back_and_says_why(cluster, operator, settings):
    settings.CLUSTERUI_BOOT_WINDOW_S = 0
    RepairSettings.objects.create(cluster=cluster, blast_radius_pct=10)
    nodes = NodeFactory.create_batch(20, cluster=cluster)  # 10 %: 2 nodes at a time
    do_pause_node(nodes[0], actor=operator, reason="cabling")
    first = do_approve_repair(RepairFactory(node=nodes[1]), actor=operator)
    assert first.status == Status.RUNNING
    held = do_approve_repair(RepairFactory(node=nodes[2]), actor=operator)
    assert held.status == Status.WAITING
    assert held.waiting_reason == ("2 of 20 nodes are out of service (paused or under repair); "
                                   "the limit is 10 % (2 nodes)")
    nodes[2].refresh_from_db()
    assert nodes[2].state != NodeState.PAUSED


def test_a_small_cluster_can_always_repair_one_node(cluster, operator):
    node = NodeFactory(cluster=cluster)
    assert do_approve_repair(RepairFactory(node=node), actor=operator).status == Status.RUNNING
    node.refresh_from_db()
    assert node.state == NodeState.PAUSED
    assert node.state_reason.endswith("(reboot) is running")
