"""Alerts from the change feed: each kind opens when its condition starts and resolves when
it ends, whatever order or how often the changes are read."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters.change_feed import Kind, record_change
from healthchecks.models import CheckRun
from healthchecks.services import do_close_health_event, do_record_health_event
from nodes.choices import NodeState
from nodes.services import do_pause_node, do_resume_node
from nodes.tests.factories import NodeFactory
from notifications.alerts import update_alerts
from notifications.choices import AlertKind
from notifications.models import Alert
from repairs.choices import Status
from repairs.models import RepairTransition
from repairs.tests.factories import RepairFactory
from startup.models import ScriptRun

pytestmark = pytest.mark.django_db


def announce(repair):
    record_change(Kind.REPAIR, cluster_id=repair.cluster_id, node_id=repair.node_id,
                  object_id=repair.pk)


def firing(kind):
    return list(Alert.objects.firing().filter(kind=kind))


def test_a_proposed_repair_fires_until_someone_decides(cluster):
    repair = RepairFactory(node=NodeFactory(cluster=cluster, name="gpu-0007"))
    announce(repair)
    update_alerts()
    [alert] = firing(AlertKind.REPAIR_AWAITING_APPROVAL)
    assert alert.node_name == "gpu-0007" and alert.signature == "xid:79"
    assert alert.path == repair.get_absolute_url()
    assert "reboot recommended for xid:79" in alert.summary

    announce(repair)  # read again: still one
    update_alerts()
    assert len(firing(AlertKind.REPAIR_AWAITING_APPROVAL)) == 1

    repair.status = Status.APPROVED
    repair.save()
    announce(repair)
    update_alerts()
    assert firing(AlertKind.REPAIR_AWAITING_APPROVAL) == []
    assert Alert.objects.get(pk=alert.pk).resolved_at is not None


def test_a_failed_repair_is_one_alert_however_often_it_is_read(cluster):
    repair = RepairFactory(node=NodeFactory(cluster=cluster), status=Status.FAILED,
                           outcome="the node did not come back in 1800 s")
    for _ in range(2):
        announce(repair)
        update_alerts()
    [alert] = Alert.objects.filter(kind=AlertKind.REPAIR_FAILED)
    assert "did not come back" in alert.summary
    assert alert.resolved_at == alert.opened_at  # it happened: nothing to wait for
    announce(repair)
    update_alerts()
    assert Alert.objects.filter(kind=AlertKind.REPAIR_FAILED).count() == 1


def test_an_open_event_fires_and_its_close_resolves_it(cluster):
    node = NodeFactory(cluster=cluster, name="gpu-0003")
    event = do_record_health_event(node, signature="thermal_throttle", severity="warning",
                                   message="held 60 s")
    update_alerts()
    [alert] = firing(AlertKind.NODE_UNHEALTHY)
    assert (alert.signature, alert.severity) == ("thermal_throttle", "warning")
    assert alert.path == node.get_absolute_url() and "held 60 s" in alert.summary

    do_close_health_event(event, reason="cleared")
    update_alerts()
    assert firing(AlertKind.NODE_UNHEALTHY) == []


def test_a_storms_events_cost_the_notifier_as_many_statements_as_a_few(cluster):
    """In an event storm the notifier's worker spent 79 % of its time on one SELECT, one
    EXISTS and one INSERT per event, and the recommender queued behind it (bench/README.md,
    "Event storm"). Now a tick's events cost the same statements however many they are:
    some opened, some closed before the notifier read them, one already firing."""
    def tick_with(node_count):
        nodes = [NodeFactory(cluster=cluster) for _ in range(node_count)]
        events = [do_record_health_event(node, signature=signature, severity="warning",
                                         message="held 60 s")
                  for node in nodes for signature in ("thermal_throttle", "hw_slowdown")]
        closed = events[:node_count // 2]
        for event in closed:
            do_close_health_event(event, reason="cleared")
        Alert.objects.create(cluster=cluster, kind=AlertKind.NODE_UNHEALTHY,
                             key=f"event:{events[-1].pk}", summary="s", path="/",
                             opened_at=timezone.now())
        with CaptureQueriesContext(connection) as queries:
            update_alerts()
        return len(queries), events, closed

    tick_with(2)  # the first tick of all reads what later ticks keep
    few, _, _ = tick_with(2)
    many, events, closed = tick_with(40)

    assert many == few
    firing_keys = {alert.key for alert in firing(AlertKind.NODE_UNHEALTHY)}
    assert {f"event:{event.pk}" for event in events if event not in closed} <= firing_keys
    assert not {f"event:{event.pk}" for event in closed} & firing_keys
    assert Alert.objects.filter(key=f"event:{events[-1].pk}").count() == 1  # not twice


def test_the_cluster_is_degraded_over_its_threshold_and_recovers(cluster, setter):
    cluster.degraded_threshold_pct = 20
    cluster.save()
    nodes = [NodeFactory(cluster=cluster) for _ in range(10)]
    for node in nodes[:2]:  # 20 %: not over
        do_pause_node(node, actor=None, reason="reseat")
    update_alerts()
    assert firing(AlertKind.CLUSTER_DEGRADED) == []

    do_pause_node(nodes[2], actor=None, reason="reseat")
    update_alerts()
    [alert] = firing(AlertKind.CLUSTER_DEGRADED)
    assert "3 of 10 nodes are out of service" in alert.summary

    for node in nodes[:3]:
        do_resume_node(node, actor=setter)
    update_alerts()
    assert firing(AlertKind.CLUSTER_DEGRADED) == []


def test_a_failed_acceptance_test_and_a_failed_startup_script_are_alerts(cluster):
    node = NodeFactory(cluster=cluster, state=NodeState.PENDING)
    now = timezone.now()
    run = CheckRun.objects.create(node=node, check_name="gpu_burn", purpose="acceptance",
                                  status=CheckRun.Status.FAILED, message="412 TFLOPS < 600",
                                  requested_at=now, deadline_at=now)
    record_change(Kind.CHECK_RUN, cluster_id=cluster.pk, node_id=node.pk, object_id=run.pk)
    script_run = ScriptRun.objects.create(node=node, event="node_boot", exit_code=3,
                                          duration_s=1.5, version_number=4, received_at=now)
    record_change(Kind.SCRIPT_RUN, cluster_id=cluster.pk, node_id=node.pk,
                  object_id=script_run.pk)
    passed = ScriptRun.objects.create(node=node, event="job_end", exit_code=0, duration_s=1,
                                      received_at=now)
    record_change(Kind.SCRIPT_RUN, cluster_id=cluster.pk, node_id=node.pk, object_id=passed.pk)
    update_alerts()
    [acceptance] = Alert.objects.filter(kind=AlertKind.ACCEPTANCE_FAILED)
    assert "gpu_burn failed: 412 TFLOPS < 600" in acceptance.summary
    [script] = Alert.objects.filter(kind=AlertKind.SCRIPT_FAILED)
    assert "version 4 exited 3" in script.summary


def test_a_repair_with_no_progress_for_an_hour_is_stuck_until_it_moves(cluster, settings):
    settings.CLUSTERUI_NOTIFY_REPAIR_STUCK_S = 3600
    long_ago = timezone.now() - timedelta(hours=2)
    repair = RepairFactory(node=NodeFactory(cluster=cluster), status=Status.WAITING,
                           requested_at=long_ago, waiting_reason="3 of 10 nodes are out")
    RepairTransition.objects.create(repair=repair, from_status="proposed", to_status="waiting",
                                    actor_name="ada", at=long_ago)
    fresh = RepairFactory(node=NodeFactory(cluster=cluster), status=Status.RUNNING)
    update_alerts()
    [alert] = firing(AlertKind.REPAIR_STUCK)
    assert alert.key == f"repair:{repair.pk}" and "3 of 10 nodes are out" in alert.summary
    assert fresh.pk not in [int(a.key.split(":")[1]) for a in firing(AlertKind.REPAIR_STUCK)]

    repair.status = Status.SUCCEEDED
    repair.save()
    announce(repair)
    update_alerts()
    assert firing(AlertKind.REPAIR_STUCK) == []


def test_alerts_of_a_removed_node_resolve(cluster, setter):
    from nodes.services import do_remove_node
    node = NodeFactory(cluster=cluster)
    do_record_health_event(node, signature="xid:79", severity="critical")
    repair = RepairFactory(node=node)
    announce(repair)
    update_alerts()
    assert len(firing(AlertKind.NODE_UNHEALTHY)) == len(firing(
        AlertKind.REPAIR_AWAITING_APPROVAL)) == 1
    do_remove_node(node, actor=setter, reason="decommissioned")
    update_alerts()
    assert firing(AlertKind.NODE_UNHEALTHY) == firing(AlertKind.REPAIR_AWAITING_APPROVAL) == []


def test_a_stuck_repair_that_moves_again_resolves(cluster, settings):
    settings.CLUSTERUI_NOTIFY_REPAIR_STUCK_S = 3600
    long_ago = timezone.now() - timedelta(hours=2)
    repair = RepairFactory(node=NodeFactory(cluster=cluster), status=Status.RUNNING,
                           requested_at=long_ago)
    update_alerts()
    assert len(firing(AlertKind.REPAIR_STUCK)) == 1
    RepairTransition.objects.create(repair=repair, from_status="waiting", to_status="running",
                                    actor_name="system", at=timezone.now())
    update_alerts()
    assert firing(AlertKind.REPAIR_STUCK) == []


def test_old_resolved_alerts_and_old_deliveries_are_pruned(cluster, make_channel, settings):
    from notifications.alerts import prune
    from notifications.deliveries import create_delivery
    from notifications.messages import channel_test_message
    from notifications.models import Delivery
    settings.CLUSTERUI_NOTIFY_RETENTION_DAYS = 30
    now = timezone.now()
    old = now - timedelta(days=31)
    channel, _ = make_channel("json://127.0.0.1:9/x")

    def an_alert(key, resolved_at):
        return Alert.objects.create(cluster=cluster, kind=AlertKind.NODE_UNHEALTHY, key=key,
                                    summary=key, path="/", opened_at=old, resolved_at=resolved_at)

    an_alert("gone", old)
    kept = [an_alert("firing", None), an_alert("recent", now - timedelta(days=1))]
    sent = create_delivery(channel, channel_test_message(channel, "ada", old), now=old)
    waiting = create_delivery(channel, channel_test_message(channel, "ada", old), now=old)
    Delivery.objects.filter(pk=sent.pk).update(status=Delivery.Status.SENT)
    assert prune(now) == 2
    assert set(Alert.objects.all()) == set(kept)
    assert list(Delivery.objects.all()) == [waiting]  # not finished: kept
