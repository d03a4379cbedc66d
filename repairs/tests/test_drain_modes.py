"""Drain modes (DESIGN.md "Drain modes"): the plan a repair carries from its signature and the
cluster's policy, the approver's choice, and the drain step on Kubernetes against the fake
API server (schedulers/tests/kubernetes_fake.py). tests/test_drain_modes_slurm.py runs each
mode against real Slurm."""

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from clusters.models import AuditEntry, Cluster
from healthchecks.services import do_record_health_event
from nodes.models import AgentCommand
from nodes.services import do_record_hello, do_register_node
from notifications.alerts import sweep_stuck_repairs, update_alerts
from notifications.choices import AlertKind
from notifications.models import Alert
from repairs import steps
from repairs.choices import AtDeadline, DrainMode, StepStatus
from repairs.drain_modes import DrainPlan, plan_for, plan_of
from repairs.models import RepairPolicy
from repairs.services import (
    RepairRefused,
    do_approve_repair,
    do_propose_repair,
    refresh_recommendation,
)
from schedulers.tests.kubernetes_fake import (  # noqa: F401 - fake_api is a fixture
    NODE,
    fake_api,
    make_node,
    make_pod,
    pdb_refusal,
)

from .helpers import past_the_bundle

pytestmark = pytest.mark.django_db

DAY = 24 * 3600


@pytest.mark.parametrize("signature, action, plan", [
    ("xid:79", "reboot", DrainPlan("now")),
    ("gpu_lost", "reboot", DrainPlan("now")),
    ("thermal_throttle", "failover", DrainPlan("after_jobs", DAY, at_deadline="keep_waiting")),
    ("slurmd_flapping", "reboot", DrainPlan("after_jobs", DAY, at_deadline="keep_waiting")),
    ("job_leftovers", "reset_gpu", DrainPlan("after_jobs", DAY, at_deadline="keep_waiting")),
    ("ecc_dbe", "reset_gpu", DrainPlan("signal", 600, signal="USR1")),
    ("row_remap_pending", "reboot", DrainPlan("signal", 600, signal="USR1")),
    ("zombie_processes", "cleanup", DrainPlan("no_drain")),
    ("job_leftovers", "cleanup", DrainPlan("no_drain")),
    ("gres_drift", "reconfigure", DrainPlan("no_drain")),
    ("manual", "reboot", DrainPlan("after_jobs", DAY, at_deadline="keep_waiting")),
])
def test_without_a_policy_the_catalog_chooses_the_plan(cluster, signature, action, plan):
    assert plan_for(cluster, signature, action) == plan


def test_a_policy_row_sets_the_mode_its_deadline_and_the_signal(cluster, admin):
    RepairPolicy.objects.create(cluster=cluster, signature="xid:79", action=None,
                                drain_mode="signal", drain_deadline_s=300, drain_signal="URG",
                                drain_signal_all_steps=True, updated_by=admin)

    assert plan_for(cluster, "xid:79", "reboot") == DrainPlan(
        "signal", 300, signal="URG", signal_all_steps=True)
    # The row's deadline is its own mode's: another mode gets that mode's defaults.
    assert plan_for(cluster, "xid:79", "reboot", mode="after_jobs") == DrainPlan(
        "after_jobs", DAY, at_deadline="keep_waiting")
    assert plan_for(cluster, "xid:79", "reboot", mode="now") == DrainPlan("now")
    assert plan_for(cluster, "xid:79", "reboot").words == (
        "signal, then wait: SIGURG to every step of each job, wait up to 5 min, then go on as "
        "now")


def test_a_recommendation_carries_its_signatures_plan(cluster, no_tasks):
    node = do_register_node(cluster, "gpu-001")
    do_record_hello(node, boot_id="boot-1")
    do_record_health_event(node, signature="xid:79", severity="critical",
                           message="GPU has fallen off the bus")

    repair = refresh_recommendation(node)

    assert (repair.action, repair.drain_mode) == ("reboot", DrainMode.NOW)
    assert plan_of(repair) == DrainPlan("now")


def test_the_approver_chooses_another_mode_and_it_is_recorded(cluster, operator, no_tasks):
    node = do_register_node(cluster, "gpu-001")
    repair = do_propose_repair(node, action="reboot", actor=operator, reason="flaky NVLink")
    assert plan_of(repair).mode == DrainMode.AFTER_JOBS

    approved = do_approve_repair(repair, actor=operator, comment="checkpoint first",
                                 drain_mode="signal")

    assert plan_of(approved) == DrainPlan("signal", 600, signal="USR1")
    assert approved.approval_view["drain"].startswith("signal, then wait: SIGUSR1")
    entry = AuditEntry.objects.get(action="repair.approve")
    assert entry.changes["drain_mode"] == {"before": "after_jobs", "after": "signal"}


@pytest.mark.parametrize("action, mode, error", [
    ("cleanup", "now", "a cleanup cannot drain 'now'"),
    ("reboot", "no_drain", "a reboot cannot drain 'no drain'"),
    ("reboot", "sometime", "'sometime' is not a drain mode"),
])
def test_a_mode_the_action_cannot_have_is_refused(cluster, operator, no_tasks, action, mode,
                                                  error):
    node = do_register_node(cluster, "gpu-001")
    repair = do_propose_repair(node, action=action, actor=operator, reason="x")

    with pytest.raises(RepairRefused, match=error):
        do_approve_repair(repair, actor=operator, drain_mode=mode)


# The drain step on Kubernetes, against the fake API server.


@pytest.fixture
def k8s_node(cluster, fake_api, tmp_path):
    """gpu-017 of a Kubernetes cluster whose API server is the fake, with one training pod
    and one serving pod whose disruption budget refuses every eviction."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "prod",
        "clusters": [{"name": "prod", "cluster": {"server": fake_api.url}}],
        "users": [{"name": "clusterui", "user": {"token": "t"}}],
        "contexts": [{"name": "prod", "context": {"cluster": "prod", "user": "clusterui"}}]}))
    Cluster.objects.filter(pk=cluster.pk).update(scheduler="kubernetes",
                                                 scheduler_config=str(kubeconfig))
    cluster.refresh_from_db()
    fake_api.add_node(make_node())
    fake_api.add_pod(make_pod("train-7b-0"))
    web = make_pod("web-5d8f7-abcde", "serving", ("ReplicaSet", "web-5d8f7"))
    web.spec.termination_grace_period_seconds = 45
    fake_api.add_pod(web)
    fake_api.eviction_errors[("serving", "web-5d8f7-abcde")] = pdb_refusal("web-pdb")
    node = do_register_node(cluster, NODE)
    do_record_hello(node, boot_id="boot-1")
    return node


def start(node, operator, enqueued, drain_mode):
    repair = do_propose_repair(node, action="reboot", actor=operator, reason="flaky NVLink")
    repair = do_approve_repair(repair, actor=operator, drain_mode=drain_mode)
    return repair, enqueued.pop(0)


def deletes(fake_api):
    return [r.path for r in fake_api.requests if r.method == "DELETE"]


def test_a_budget_keeps_a_signal_drain_waiting_until_its_deadline_then_pods_are_deleted(
        k8s_node, operator, enqueued, fake_api):
    repair, drain_id = start(k8s_node, operator, enqueued, "signal")
    t0 = timezone.now()

    waited = steps.run_step(drain_id, now=t0)
    assert isinstance(waited, steps.Wait)
    assert fake_api.nodes[NODE]["spec"]["unschedulable"] is True
    assert "deletionTimestamp" in fake_api.pods[("research", "train-7b-0")]["metadata"]
    assert deletes(fake_api) == []  # the budget refused: nothing is deleted before the deadline

    steps.run_step(drain_id, now=t0 + timedelta(seconds=300))
    step = repair.steps.get(pk=drain_id)
    assert step.status == StepStatus.WAITING and deletes(fake_api) == []
    assert [job["id"] for job in step.waiting_for_jobs] == ["research/train-7b-0",
                                                            "serving/web-5d8f7-abcde"]
    assert step.drain_deadline == step.started_at + timedelta(seconds=600)

    steps.run_step(drain_id, now=t0 + timedelta(seconds=601))
    assert deletes(fake_api) == ["/api/v1/namespaces/serving/pods/web-5d8f7-abcde"]
    step.refresh_from_db()
    assert step.details["stopping"] == "the deadline passed"
    assert "deleted serving/web-5d8f7-abcde with its 45 s grace period" in step.output

    fake_api.finish_terminating()
    done = steps.run_step(drain_id, now=t0 + timedelta(seconds=610))
    assert isinstance(done, steps.Done)
    past_the_bundle(enqueued)
    steps.run_step(enqueued.pop(0))
    assert AgentCommand.objects.filter(node=k8s_node, action="reboot").exists()


def test_past_its_deadline_an_after_jobs_drain_keeps_waiting_alerts_and_goes_on_when_told(
        k8s_node, operator, enqueued, fake_api):
    repair, drain_id = start(k8s_node, operator, enqueued, "after_jobs")
    assert plan_of(repair).at_deadline == AtDeadline.KEEP_WAITING
    t0 = timezone.now()
    steps.run_step(drain_id, now=t0)
    fake_api.finish_terminating()  # the training pod left; the serving pod's budget refuses

    late = t0 + timedelta(days=1, seconds=1)
    waited = steps.run_step(drain_id, now=late)
    assert "past its deadline" in waited.message and "serving/web-5d8f7-abcde" in waited.message
    assert deletes(fake_api) == []
    update_alerts(now=late)
    alert = Alert.objects.get(kind=AlertKind.REPAIR_PAST_DEADLINE)
    assert "serving/web-5d8f7-abcde" in alert.summary and alert.resolved_at is None
    # Waiting for jobs is not being stuck.
    sweep_stuck_repairs(late + timedelta(hours=2))
    assert not Alert.objects.filter(kind=AlertKind.REPAIR_STUCK).exists()

    steps.do_go_on_now(repair, actor=operator, comment="the replicas can move")
    assert enqueued == [drain_id]
    steps.run_step(enqueued.pop(0), now=late + timedelta(seconds=5))
    assert deletes(fake_api) == ["/api/v1/namespaces/serving/pods/web-5d8f7-abcde"]
    entry = AuditEntry.objects.get(action="repair.go_on_now")
    assert entry.changes == {"comment": "the replicas can move",
                             "jobs": ["serving/web-5d8f7-abcde"]}
    with pytest.raises(RepairRefused, match="already stops its jobs"):
        steps.do_go_on_now(repair, actor=operator, comment="again")
    update_alerts(now=late + timedelta(seconds=6))
    assert Alert.objects.get(kind=AlertKind.REPAIR_PAST_DEADLINE).resolved_at is not None


def test_going_on_now_needs_a_drain_that_waits_and_a_reason(k8s_node, operator, enqueued):
    repair, _ = start(k8s_node, operator, enqueued, "after_jobs")
    with pytest.raises(RepairRefused, match="Say why"):
        steps.do_go_on_now(repair, actor=operator, comment=" ")
    with pytest.raises(RepairRefused, match="is not waiting for jobs"):
        steps.do_go_on_now(repair, actor=operator, comment="go")
