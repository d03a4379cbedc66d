"""The Notifications pages: admins add, change, test and delete channels; a URL or key is
never shown back (a webhook's key once, at its making); everyone reads the delivery log."""

import pytest
from django.urls import reverse

from clusters.models import AuditEntry, Secret
from clusters.secret_store import value_of
from notifications.models import Channel, Delivery

pytestmark = pytest.mark.django_db
SLACK = "slack://T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7"
FORM = {"kinds": ["repair_awaiting_approval", "node_unhealthy"], "min_severity": "critical",
        "signature_prefix": "xid:", "enabled": "on", "group_wait_s": 30,
        "group_interval_s": 120, "repeat_interval_s": 14400, "max_per_hour": 30,
        "send_resolved": "on"}


def test_an_admin_adds_an_apprise_channel_and_its_url_is_never_shown(cluster, admin,
                                                                     client_for):
    client = client_for(admin)
    response = client.post(reverse("notifications:create", args=[cluster.slug]),
                           {"name": "oncall-slack", "kind": "apprise", "url": SLACK, **FORM})
    channel = Channel.objects.get(name="oncall-slack")
    assert response.status_code == 302
    assert value_of(channel.url_secret) == SLACK
    assert channel.url_hint == "slack://…"
    rules = {rule.kind: rule for rule in channel.rules.all()}
    assert set(rules) == {"repair_awaiting_approval", "node_unhealthy"}
    assert (rules["node_unhealthy"].min_severity, rules["node_unhealthy"].signature_prefix) == (
        "critical", "xid:")
    page = client.get(reverse("notifications:detail", args=[cluster.slug, channel.pk]))
    listing = client.get(reverse("notifications:list", args=[cluster.slug]))
    for html in (page.content.decode(), listing.content.decode()):
        assert "TIiajkdnlazkcOXrIdevi7" not in html and "slack://…" in html
    entry = AuditEntry.objects.get(action="notification_channel.create")
    assert "TIiajkdnlazkcOXrIdevi7" not in str(entry.changes)


def test_a_url_apprise_cannot_read_is_refused(cluster, admin, client_for):
    response = client_for(admin).post(reverse("notifications:create", args=[cluster.slug]),
                                      {"name": "x", "kind": "apprise", "url": "nope://x", **FORM})
    assert response.status_code == 400 and b"Apprise does not understand" in response.content
    assert not Channel.objects.exists()


def test_a_webhook_channel_shows_its_signing_key_once(cluster, admin, client_for):
    client = client_for(admin)
    response = client.post(reverse("notifications:create", args=[cluster.slug]),
                           {"name": "automation", "kind": "webhook",
                            "url": "https://hooks.example.com/in", **FORM})
    channel = Channel.objects.get()
    key = value_of(channel.signing_secret)
    assert response.status_code == 200 and key.startswith("whsec_")
    assert key in response.content.decode()
    page = client.get(reverse("notifications:detail", args=[cluster.slug, channel.pk]))
    assert key not in page.content.decode()

    rotated = client.post(reverse("notifications:rotate", args=[cluster.slug, channel.pk]))
    channel.refresh_from_db()
    new = value_of(channel.signing_secret)
    assert new != key and new in rotated.content.decode()
    assert value_of(channel.previous_signing_secret) == key


def test_editing_without_a_url_keeps_it_and_says_what_changed(cluster, admin, client_for,
                                                              make_channel):
    channel, _ = make_channel(SLACK, name="oncall")
    response = client_for(admin).post(
        reverse("notifications:detail", args=[cluster.slug, channel.pk]),
        {"name": "oncall", "url": "", **FORM, "group_wait_s": 90}, follow=True)
    channel.refresh_from_db()
    assert channel.group_wait_s == 90 and value_of(channel.url_secret) == SLACK
    assert b"Saved: group_wait_s, rules." in response.content
    entry = AuditEntry.objects.get(action="notification_channel.update")
    assert entry.changes["group_wait_s"] == {"before": 30, "after": 90}


def test_send_test_queues_a_delivery_that_the_log_shows(cluster, admin, viewer, client_for,
                                                        make_channel):
    channel, _ = make_channel(SLACK, name="oncall")
    client_for(admin).post(reverse("notifications:test", args=[cluster.slug, channel.pk]))
    delivery = Delivery.objects.get()
    assert delivery.event_type == "test" and delivery.status == Delivery.Status.PENDING
    log = client_for(viewer).get(reverse("notifications:deliveries",
                                         args=[cluster.slug, channel.pk]), HTTP_HX_REQUEST="true")
    assert log.status_code == 200 and b"test message from clusterui" in log.content
    assert b"<html" not in log.content
    # Opened directly, it is the channel's page, where the log is (not a bare fragment).
    direct = client_for(viewer).get(reverse("notifications:deliveries",
                                            args=[cluster.slug, channel.pk]))
    assert direct.status_code == 302
    assert direct["Location"] == reverse("notifications:detail", args=[cluster.slug, channel.pk])


def test_deleting_a_channel_deletes_its_secrets(cluster, admin, client_for, make_channel):
    channel, _ = make_channel("https://hooks.example.com/in", kind="webhook")
    names = [channel.url_secret, channel.signing_secret]
    client_for(admin).post(reverse("notifications:delete", args=[cluster.slug, channel.pk]))
    assert not Channel.objects.exists()
    assert not Secret.objects.filter(name__in=names).exists()


def test_an_operator_reads_channels_but_cannot_change_them(cluster, operator, client_for,
                                                            make_channel):
    channel, _ = make_channel(SLACK, name="oncall")
    client = client_for(operator)
    assert client.get(reverse("notifications:detail", args=[cluster.slug, channel.pk])
                      ).status_code == 200
    response = client.post(reverse("notifications:detail", args=[cluster.slug, channel.pk]),
                           {"name": "renamed", "url": "", **FORM})
    assert response.status_code == 403
    channel.refresh_from_db()
    assert channel.name == "oncall"
