"""Sending, against real receivers on loopback: email through Apprise to an SMTP server,
a Slack-shaped POST (Apprise's Mattermost plugin posts Slack's incoming-webhook JSON to any
host; its Slack plugin only to hooks.slack.com), and the signed webhook, verified with the
standardwebhooks library. A failing receiver is retried and logged; a delivery is sent once
however many workers try it at once."""

import json
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from standardwebhooks import Webhook, WebhookVerificationError

from clusters.models import Secret
from notifications.deliveries import RETRY_DELAYS_S, create_delivery, deliver
from notifications.messages import alert_message, channel_test_message
from notifications.models import Alert, Delivery
from notifications.services import do_rotate_signing_key, do_send_test

pytestmark = pytest.mark.django_db


def an_alert(cluster, **fields):
    return Alert.objects.create(
        cluster=cluster, kind="repair_awaiting_approval", key="repair:1", node_name="gpu-0042",
        signature="xid:79", summary="gpu-0042: reboot recommended for xid:79 (repair #1)",
        path="/c/prod-h200/repair/5b0e/", opened_at=timezone.now(), **fields)


def queue(channel, message, now=None):
    return create_delivery(channel, message, now=now or timezone.now())


def test_an_email_reaches_the_smtp_server_with_the_link(cluster, make_channel, smtp_receiver,
                                                          settings):
    settings.CLUSTERUI_PUBLIC_URL = "https://console.example.com"
    channel, _ = make_channel(smtp_receiver.url())
    delivery = queue(channel, alert_message(channel, "repair_awaiting_approval",
                                            [an_alert(cluster)], [], timezone.now()))
    assert deliver(delivery.pk).status == Delivery.Status.SENT
    [mail] = smtp_receiver.messages
    assert mail["To"] == "oncall@example.com"
    assert mail["Subject"] == f"[{cluster.name}] FIRING:1 a repair awaits approval"
    text = mail.get_body(("plain",)).get_content()
    assert "https://console.example.com/c/prod-h200/repair/5b0e/" in text


def test_a_slack_shaped_message_reaches_the_receiver(cluster, make_channel, http_receiver):
    channel, _ = make_channel(f"mmost://127.0.0.1:{http_receiver.port}/abcdefghijklmnop")
    delivery = queue(channel, channel_test_message(channel, "ada", timezone.now()))
    assert deliver(delivery.pk).status == Delivery.Status.SENT
    [(path, headers, body)] = http_receiver.requests
    assert path == "/hooks/abcdefghijklmnop"
    assert "test message from clusterui" in json.loads(body)["text"]


def test_the_webhook_is_signed_and_verifies_with_standardwebhooks(cluster, make_channel,
                                                                 http_receiver):
    channel, key = make_channel(http_receiver.url(), kind="webhook")
    alert = an_alert(cluster)
    delivery = queue(channel, alert_message(channel, "repair_awaiting_approval", [alert], [],
                                            timezone.now()))
    assert deliver(delivery.pk).status == Delivery.Status.SENT
    [(_, headers, body)] = http_receiver.requests
    payload = Webhook(key).verify(body, headers)
    assert headers["webhook-id"] == str(delivery.message_id)
    assert payload["type"] == "alert.firing"
    assert payload["data"]["firing"][0]["summary"] == alert.summary
    with pytest.raises(WebhookVerificationError):
        Webhook("whsec_" + "A" * 43 + "=").verify(body, headers)
    with pytest.raises(WebhookVerificationError):  # a byte changed
        Webhook(key).verify(body.replace(b"gpu-0042", b"gpu-0043"), headers)


def test_after_a_rotation_both_keys_verify_until_the_overlap_ends(cluster, make_channel,
                                                                   http_receiver, setter):
    channel, old = make_channel(http_receiver.url(), kind="webhook")
    new = do_rotate_signing_key(channel, actor=setter)
    assert new != old
    deliver(do_send_test(channel, actor=setter).pk)
    _, headers, body = http_receiver.requests[-1]
    assert len(headers["webhook-signature"].split(" ")) == 2
    Webhook(old).verify(body, headers)
    Webhook(new).verify(body, headers)

    channel.refresh_from_db()
    channel.previous_signing_until = timezone.now() - timedelta(seconds=1)
    channel.save()
    deliver(do_send_test(channel, actor=setter).pk)
    _, headers, body = http_receiver.requests[-1]
    Webhook(new).verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(old).verify(body, headers)


def test_a_failing_receiver_is_retried_with_backoff_logged_and_finally_failed(
        cluster, make_channel, http_receiver):
    channel, _ = make_channel(http_receiver.url(), kind="webhook")
    http_receiver.statuses = [500] * (len(RETRY_DELAYS_S) + 1)
    delivery = queue(channel, channel_test_message(channel, "ada", timezone.now()))
    now = timezone.now()
    for attempt, delay in enumerate(RETRY_DELAYS_S, start=1):
        delivery = deliver(delivery.pk, now=now)
        assert (delivery.status, delivery.attempts, delivery.response_code) == (
            Delivery.Status.PENDING, attempt, 500)
        assert delivery.error == "HTTP 500: receiver says no"
        assert deliver(delivery.pk, now=now) is None  # not due yet
        assert delivery.next_attempt_at - timezone.now() <= timedelta(seconds=delay)
        now = delivery.next_attempt_at + timedelta(seconds=1)
    delivery = deliver(delivery.pk, now=now)
    assert delivery.status == Delivery.Status.FAILED
    assert delivery.attempts == len(RETRY_DELAYS_S) + 1
    assert len(http_receiver.requests) == len(RETRY_DELAYS_S) + 1
    ids = {headers["webhook-id"] for _, headers, _ in http_receiver.requests}
    assert ids == {str(delivery.message_id)}  # one id through every retry


def test_a_receiver_that_is_down_is_an_error_in_the_log_without_its_url(cluster, make_channel,
                                                                       http_receiver):
    channel, _ = make_channel(http_receiver.url("/hook/s3cr3tpath?token=abc123"), kind="webhook")
    http_receiver.stop()
    delivery = deliver(queue(channel, channel_test_message(channel, "ada", timezone.now())).pk)
    assert delivery.status == Delivery.Status.PENDING and delivery.response_code is None
    assert delivery.error == "ConnectionError: no answer from 127.0.0.1: [Errno 111] Connection refused"


def test_apprises_errors_are_shown_without_the_channels_url(cluster, make_channel,
                                                            http_receiver):
    channel, _ = make_channel(f"json://127.0.0.1:{http_receiver.port}/in/t0ken-s3cret")
    http_receiver.statuses = [500]
    delivery = deliver(queue(channel, channel_test_message(channel, "ada", timezone.now())).pk)
    assert delivery.status == Delivery.Status.PENDING and delivery.error
    assert "t0ken-s3cret" not in delivery.error


def test_a_url_missing_from_the_secrets_store_says_so(cluster, make_channel):
    channel, _ = make_channel("json://127.0.0.1:9/x")
    Secret.objects.filter(name=channel.url_secret).delete()
    delivery = deliver(queue(channel, channel_test_message(channel, "ada", timezone.now())).pk)
    assert "missing from the secrets store" in delivery.error


@pytest.mark.django_db(transaction=True)
def test_four_workers_at_once_send_a_delivery_once(cluster, make_channel, http_receiver):
    channel, _ = make_channel(http_receiver.url(), kind="webhook")
    delivery = queue(channel, channel_test_message(channel, "ada", timezone.now()))
    barrier = threading.Barrier(4)
    outcomes = []

    def worker():
        barrier.wait()
        try:
            outcomes.append(deliver(delivery.pk))
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(http_receiver.requests) == 1
    assert sum(outcome is not None for outcome in outcomes) == 1


def test_a_sender_that_died_leaves_the_delivery_to_be_sent_after_its_lease(cluster,
                                                                          make_channel,
                                                                          http_receiver):
    channel, _ = make_channel(http_receiver.url(), kind="webhook")
    delivery = queue(channel, channel_test_message(channel, "ada", timezone.now()))
    now = timezone.now()
    Delivery.objects.filter(pk=delivery.pk).update(
        status=Delivery.Status.SENDING, lease_until=now + timedelta(seconds=60), attempts=1)
    assert deliver(delivery.pk, now=now) is None
    assert deliver(delivery.pk, now=now + timedelta(seconds=61)).status == Delivery.Status.SENT
