"""Maintenance windows: when they are on, and what they hold back (recommendations, starts,
notifications) and mark (events); the page and the overview."""

from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

import pytest
from django.urls import reverse
from django.utils import timezone

from clusters.models import AuditEntry
from clusters.roles import Role
from clusters.tests.factories import UserFactory
from healthchecks.services import do_record_health_event
from nodes.maintenance import current, occurrence_at
from nodes.models import MaintenanceWindow
from nodes.services import do_create_maintenance_window, do_end_maintenance_window
from nodes.tests.factories import NodeFactory
from notifications.choices import AlertKind
from notifications.grouping import plan_deliveries
from notifications.models import Alert, Delivery
from notifications.services import do_create_channel
from repairs.choices import Status
from repairs.services import refresh_recommendation, start_repair
from repairs.tests.factories import RepairFactory

pytestmark = pytest.mark.django_db
UTC = dt_timezone.utc


def at(day, hour, minute=0):
    return datetime(2026, 12, day, hour, minute, tzinfo=UTC)


@pytest.fixture
def someone(db):
    return UserFactory(username="mia", role=Role.ADMIN)


def window(cluster, someone, **fields):
    fields.setdefault("starts_at", timezone.now() - timedelta(minutes=1))
    return do_create_maintenance_window(cluster, reason=fields.pop("reason", "rack 12 power"),
                                        actor=someone, **fields)


def test_a_one_off_window_is_on_from_its_start_to_its_end_or_until_ended(cluster, someone):
    once = window(cluster, someone, starts_at=at(5, 2), ends_at=at(5, 6))
    assert occurrence_at(once, at(5, 1, 59)) is None
    assert occurrence_at(once, at(5, 2)) == (at(5, 2), at(5, 6))
    assert occurrence_at(once, at(5, 6)) is None
    open_ended = window(cluster, someone, starts_at=at(5, 2))
    assert occurrence_at(open_ended, at(30, 0)) == (at(5, 2), None)
    do_end_maintenance_window(open_ended, actor=someone, now=at(6, 0))
    open_ended.refresh_from_db()
    assert occurrence_at(open_ended, at(6, 0)) is None


def test_a_recurring_window_is_on_for_each_occurrence(cluster, someone):
    saturdays = window(cluster, someone, starts_at=at(1, 0), cron="0 2 * * 6",
                       duration_minutes=240, ends_at=at(20, 0))
    assert occurrence_at(saturdays, at(5, 1, 59)) is None  # Saturday 5 December
    assert occurrence_at(saturdays, at(5, 2)) == (at(5, 2), at(5, 6))
    assert occurrence_at(saturdays, at(5, 5, 59)) == (at(5, 2), at(5, 6))
    assert occurrence_at(saturdays, at(5, 6)) is None
    assert occurrence_at(saturdays, at(12, 3)) == (at(12, 2), at(12, 6))
    assert occurrence_at(saturdays, at(19, 3)) == (at(19, 2), at(19, 6))
    assert occurrence_at(saturdays, at(26, 3)) is None  # past ends_at


def test_no_repair_is_recommended_for_a_node_in_maintenance(cluster, someone):
    node = NodeFactory(cluster=cluster)
    other = NodeFactory(cluster=cluster)
    on = window(cluster, someone, nodes=[node])
    for each in (node, other):
        do_record_health_event(each, signature="xid:79", severity="critical")
    assert refresh_recommendation(node) is None
    assert refresh_recommendation(other) is not None
    do_end_maintenance_window(on, actor=someone)
    assert refresh_recommendation(node).status == Status.PROPOSED


def test_an_approved_repair_waits_out_the_window(cluster, someone):
    node = NodeFactory(cluster=cluster)
    repair = RepairFactory(node=node, status=Status.APPROVED)
    on = window(cluster, someone)  # the whole cluster
    repair = start_repair(repair)
    assert repair.status == Status.WAITING
    assert f"{node.name} is in maintenance window #{on.pk} (rack 12 power)" in repair.waiting_reason
    do_end_maintenance_window(on, actor=someone)
    assert start_repair(repair).status == Status.RUNNING


def test_events_opened_in_maintenance_are_marked(cluster, someone):
    node = NodeFactory(cluster=cluster)
    before = do_record_health_event(node, signature="thermal_throttle", severity="warning")
    window(cluster, someone, nodes=[node])
    during = do_record_health_event(node, signature="xid:31", severity="warning")
    outside = do_record_health_event(NodeFactory(cluster=cluster), signature="xid:31",
                                     severity="warning")
    assert (before.in_maintenance, during.in_maintenance, outside.in_maintenance) == (
        False, True, False)


def alert_on(node, signature, opened_at):
    return Alert.objects.create(
        cluster=node.cluster, kind=AlertKind.NODE_UNHEALTHY, key=f"event:{node.pk}:{signature}",
        node_id=node.pk, node_name=node.name, signature=signature, severity="warning",
        summary=f"{node.name}: {signature}", path=node.get_absolute_url(), opened_at=opened_at)


def test_notifications_wait_for_one_summary_at_the_windows_end(cluster, someone):
    do_create_channel(cluster, name="oncall", kind="apprise", url="json://127.0.0.1:9/x",
                      rules=[{"kind": AlertKind.NODE_UNHEALTHY}], actor=someone, group_wait_s=0)
    start = timezone.now()
    in_window, outside = NodeFactory(cluster=cluster), NodeFactory(cluster=cluster)
    on = window(cluster, someone, nodes=[in_window], starts_at=start - timedelta(minutes=1))
    held = alert_on(in_window, "thermal_throttle", start)
    fixed = alert_on(in_window, "xid:31", start)
    alert_on(outside, "thermal_throttle", start)

    assert plan_deliveries(now=start) == 1
    [first] = Delivery.objects.all()
    assert [a["node"] for a in first.payload["data"]["firing"]] == [outside.name]

    Alert.objects.filter(pk=fixed.pk).update(resolved_at=start)  # resolved in the window
    MaintenanceWindow.objects.filter(pk=on.pk).update(ended_at=start + timedelta(minutes=5))
    assert plan_deliveries(now=start + timedelta(minutes=6)) == 1
    summary = Delivery.objects.exclude(pk=first.pk).get()
    assert summary.event_type == "maintenance.ended"
    assert summary.title == (f"[{cluster.name}] maintenance window #{on.pk} ended: 1 alert "
                             f"still open")
    assert [a["id"] for a in summary.payload["data"]["firing"]] == [held.pk]
    # Counted as notified: its group does not send it again.
    assert plan_deliveries(now=start + timedelta(minutes=30)) == 0


def test_a_whole_cluster_window_holds_the_degraded_alert_too(cluster, someone):
    do_create_channel(cluster, name="oncall", kind="apprise", url="json://127.0.0.1:9/x",
                      rules=[{"kind": AlertKind.CLUSTER_DEGRADED}], actor=someone,
                      group_wait_s=0)
    window(cluster, someone)
    Alert.objects.create(cluster=cluster, kind=AlertKind.CLUSTER_DEGRADED, key="cluster",
                         summary="degraded", path="/", opened_at=timezone.now())
    assert plan_deliveries() == 0
    assert current([cluster.pk])[cluster.pk][0].whole_cluster


def test_operators_make_node_windows_admins_whole_cluster_ones(cluster, client_for):
    NodeFactory(cluster=cluster, name="gpu-0042")
    operator = UserFactory(username="otto", role=Role.OPERATOR)
    page = reverse("nodes:maintenance", args=[cluster.slug])
    client = client_for(operator)
    made = client.post(page, {"reason": "swap PSU", "nodes": "gpu-0042",
                              "starts_at": "2026-12-05 02:00", "ends_at": "2026-12-05 04:00"})
    assert made.status_code == 302
    made_window = MaintenanceWindow.objects.get()
    assert [n.name for n in made_window.nodes.all()] == ["gpu-0042"]
    entry = AuditEntry.objects.get(action="maintenance.create")
    assert entry.changes["nodes"] == ["gpu-0042"] and entry.actor == operator
    assert client.post(page, {"reason": "all", "nodes": "",
                              "starts_at": "2026-12-05 02:00"}).status_code == 403
    bad = client.post(page, {"reason": "x", "nodes": "gpu-9999", "starts_at": "2026-12-05 02:00",
                             "cron": "every saturday"})
    assert bad.status_code == 400
    assert b"No such node in this cluster: gpu-9999" in bad.content
    assert b"Not a cron expression" in bad.content
    admin = UserFactory(username="ada-admin", role=Role.ADMIN)
    assert client_for(admin).post(page, {"reason": "pause the cluster", "nodes": "",
                                         "starts_at": "2026-12-01 00:00"}).status_code == 302
    overview = client_for(operator).get(reverse("clusterui:overview", args=[cluster.slug]))
    assert "the whole cluster (pause the cluster), until someone ends it" in overview.text


def test_a_window_is_changed_and_ended_on_the_audit_trail(cluster, client_for):
    node = NodeFactory(cluster=cluster, name="gpu-0007")
    operator = UserFactory(username="olga", role=Role.OPERATOR)
    made = do_create_maintenance_window(cluster, reason="reseat", nodes=[node],
                                        starts_at=at(5, 2), actor=operator)
    client = client_for(operator)
    client.post(reverse("nodes:maintenance_change", args=[cluster.slug, made.pk]),
                {"reason": "reseat GPU 3", "ends_at": "2026-12-05 05:00"})
    made.refresh_from_db()
    assert (made.reason, made.ends_at) == ("reseat GPU 3", at(5, 5))
    change = AuditEntry.objects.get(action="maintenance.update")
    assert change.changes["reason"] == {"before": "reseat", "after": "reseat GPU 3"}
    early = client.post(reverse("nodes:maintenance_change", args=[cluster.slug, made.pk]),
                        {"reason": "x", "ends_at": "2026-12-05 01:00"}, follow=True)
    assert b"It must end after it starts." in early.content
    client.post(reverse("nodes:maintenance_end", args=[cluster.slug, made.pk]))
    made.refresh_from_db()
    assert made.ended_at is not None and made.ended_by_name == "olga"
    assert AuditEntry.objects.filter(action="maintenance.end").count() == 1


def test_a_node_window_whose_nodes_are_gone_covers_nothing(cluster, someone):
    node = NodeFactory(cluster=cluster)
    other = NodeFactory(cluster=cluster)
    window(cluster, someone, nodes=[node])
    node.delete()
    [occurrence] = current([cluster.pk])[cluster.pk]
    assert not occurrence.whole_cluster and not occurrence.covers(other.pk)
