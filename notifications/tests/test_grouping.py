"""Grouping as Alertmanager does: a storm is one message, groups wait, repeat, resolve, and a
channel's rate limit delays messages without losing what they would have said."""

from datetime import timedelta

import pytest
from django.utils import timezone

from nodes.tests.factories import NodeFactory
from notifications.choices import AlertKind
from notifications.grouping import plan_deliveries
from notifications.messages import LISTED_MAX
from notifications.models import Alert, Delivery

pytestmark = pytest.mark.django_db
URL = "json://127.0.0.1:9/unused"


def alert(cluster, kind=AlertKind.NODE_UNHEALTHY, *, node=None, signature="thermal_throttle",
          severity="warning", opened_at=None, key=None):
    node = node or NodeFactory(cluster=cluster)
    return Alert.objects.create(
        cluster=cluster, kind=kind, key=key or f"event:{node.pk}:{signature}", node_id=node.pk,
        node_name=node.name, signature=signature, severity=severity,
        summary=f"{node.name}: {signature} ({severity})", path=node.get_absolute_url(),
        opened_at=opened_at or timezone.now())


def test_a_storm_of_200_throttling_nodes_is_one_message_listing_them(cluster, make_channel):
    channel, _ = make_channel(URL, kinds=[AlertKind.NODE_UNHEALTHY], group_wait_s=30)
    start = timezone.now()
    alerts = [alert(cluster, opened_at=start) for _ in range(200)]
    xid = alert(cluster, signature="xid:79", severity="critical", opened_at=start)

    assert plan_deliveries(now=start + timedelta(seconds=10)) == 0  # group_wait
    assert plan_deliveries(now=start + timedelta(seconds=31)) == 2
    throttling, xid_message = (Delivery.objects.get(group_key=f"node_unhealthy:{s}")
                               for s in ("thermal_throttle", "xid:79"))
    assert throttling.title == f"[{cluster.name}] FIRING:200 a node is unhealthy: thermal_throttle"
    assert len(throttling.payload["data"]["firing"]) == 200
    assert throttling.body.count("/nodes/gpu-") == LISTED_MAX and "and 150 more" in throttling.body
    assert alerts[0].summary in throttling.body
    assert xid_message.payload["data"]["firing"][0]["id"] == xid.pk
    assert xid_message.payload["data"]["firing"][0]["url"].endswith(xid.path)
    assert plan_deliveries(now=start + timedelta(seconds=40)) == 0  # nothing changed


def test_a_group_sends_what_changed_after_group_interval_then_resolved(cluster, make_channel):
    channel, _ = make_channel(URL, kinds=[AlertKind.NODE_UNHEALTHY], group_wait_s=0,
                              group_interval_s=120, repeat_interval_s=3600)
    start = timezone.now()
    first = alert(cluster, opened_at=start)
    assert plan_deliveries(now=start) == 1
    second = alert(cluster, opened_at=start + timedelta(seconds=5))
    assert plan_deliveries(now=start + timedelta(seconds=60)) == 0
    assert plan_deliveries(now=start + timedelta(seconds=121)) == 1
    update = Delivery.objects.order_by("-id").first()
    assert [a["id"] for a in update.payload["data"]["firing"]] == [first.pk, second.pk]

    Alert.objects.filter(pk__in=[first.pk, second.pk]).update(resolved_at=start)
    assert plan_deliveries(now=start + timedelta(seconds=200)) == 0
    assert plan_deliveries(now=start + timedelta(seconds=242)) == 1
    resolved = Delivery.objects.order_by("-id").first()
    assert resolved.event_type == "alert.resolved"
    assert resolved.title.startswith(f"[{cluster.name}] RESOLVED:2")
    assert plan_deliveries(now=start + timedelta(hours=5)) == 0  # nothing left to say


def test_an_unchanged_group_is_sent_again_after_repeat_interval(cluster, make_channel):
    make_channel(URL, kinds=[AlertKind.REPAIR_AWAITING_APPROVAL], group_wait_s=0,
                 repeat_interval_s=3600)
    start = timezone.now()
    alert(cluster, AlertKind.REPAIR_AWAITING_APPROVAL, signature="xid:79", opened_at=start)
    assert plan_deliveries(now=start) == 1
    assert plan_deliveries(now=start + timedelta(minutes=59)) == 0
    assert plan_deliveries(now=start + timedelta(minutes=61)) == 1


def test_without_resolved_messages_a_resolved_group_says_nothing(cluster, make_channel):
    make_channel(URL, kinds=[AlertKind.NODE_UNHEALTHY], group_wait_s=0, send_resolved=False)
    start = timezone.now()
    one = alert(cluster, opened_at=start)
    plan_deliveries(now=start)
    Alert.objects.filter(pk=one.pk).update(resolved_at=start)
    assert plan_deliveries(now=start + timedelta(hours=1)) == 0
    assert Delivery.objects.count() == 1


def test_a_one_off_alert_is_sent_once_by_each_channel(cluster, make_channel):
    make_channel(URL, kinds=[AlertKind.REPAIR_FAILED], group_wait_s=0, name="chat")
    make_channel(URL, kinds=[AlertKind.REPAIR_FAILED], group_wait_s=0, name="pager")
    start = timezone.now()
    failed = alert(cluster, AlertKind.REPAIR_FAILED, signature="xid:79", opened_at=start)
    Alert.objects.filter(pk=failed.pk).update(resolved_at=start)  # as open_alert makes it
    assert plan_deliveries(now=start) == 2
    assert {d.channel.name for d in Delivery.objects.all()} == {"chat", "pager"}
    [sent] = Delivery.objects.filter(channel__name="chat")
    assert sent.payload["data"]["firing"][0]["status"] == "firing"
    assert plan_deliveries(now=start + timedelta(days=1)) == 0
    later = alert(cluster, AlertKind.REPAIR_FAILED, signature="xid:48",
                  opened_at=start + timedelta(hours=1), key="repair:2")
    Alert.objects.filter(pk=later.pk).update(resolved_at=later.opened_at)
    assert plan_deliveries(now=start + timedelta(days=1)) == 2  # the new one only
    assert all([a["id"] for a in d.payload["data"]["firing"]] == [later.pk]
               for d in Delivery.objects.filter(created_at=start + timedelta(days=1)))


def test_rules_pick_severity_and_signature(cluster, make_channel):
    make_channel(URL, rules=[{"kind": AlertKind.NODE_UNHEALTHY, "min_severity": "critical",
                              "signature_prefix": "xid:"}], group_wait_s=0)
    start = timezone.now()
    alert(cluster, signature="xid:31", severity="warning", opened_at=start)
    alert(cluster, signature="ecc_dbe", severity="critical", opened_at=start)
    wanted = alert(cluster, signature="xid:79", severity="critical", opened_at=start)
    assert plan_deliveries(now=start) == 1
    assert Delivery.objects.get().payload["data"]["firing"][0]["id"] == wanted.pk


def test_the_rate_limit_delays_messages_and_loses_nothing(cluster, make_channel):
    make_channel(URL, kinds=[AlertKind.NODE_UNHEALTHY], group_wait_s=0, max_per_hour=2)
    start = timezone.now()
    for signature in ("a", "b", "c"):
        alert(cluster, signature=signature, opened_at=start)
    assert plan_deliveries(now=start) == 2
    assert plan_deliveries(now=start + timedelta(minutes=30)) == 0
    Delivery.objects.update(created_at=start - timedelta(hours=2))  # an hour has passed
    assert plan_deliveries(now=start + timedelta(minutes=61)) == 1
    assert {d.group_key for d in Delivery.objects.all()} == {
        "node_unhealthy:a", "node_unhealthy:b", "node_unhealthy:c"}


def test_another_clusters_alerts_and_a_disabled_channel_send_nothing(cluster, make_channel):
    from clusters.tests.factories import ClusterFactory
    channel, _ = make_channel(URL, kinds=[AlertKind.NODE_UNHEALTHY], group_wait_s=0)
    other = ClusterFactory()
    alert(other, node=NodeFactory(cluster=other))
    assert plan_deliveries() == 0
    alert(cluster)
    channel.enabled = False
    channel.save()
    assert plan_deliveries() == 0
