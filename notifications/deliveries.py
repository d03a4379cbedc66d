"""Sending a message, and the delivery log.

A Delivery is written in the transaction that decides to send it, then sent by a worker
(notifications.tasks.deliver, on the notify queue: a slow receiver never holds the sweeps
or the recommender). Sending starts with a conditional update that one delivery of the
task wins (two deliveries of one task, or the retry sweep's and the first one's, send it
once). A failed attempt is tried again after RETRY_DELAYS_S, then the delivery fails;
each attempt's response code and error stay on the row. A worker that died while sending
leaves the row `sending` until its lease ends; it is then sent again with the same
webhook id, so a receiver that saw the first can drop the second (at least once, as the
Standard Webhooks spec has it).
"""

import json
import logging
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from urllib.parse import urlsplit

import apprise
import requests
from celery import current_app
from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone
from standardwebhooks import Webhook

from clusters.secret_store import SecretsUnavailable, value_of

from .models import Channel, Delivery

logger = logging.getLogger(__name__)

DELIVER_TASK = "notifications.tasks.deliver"  # by name: the domain never imports tasks
RETRY_DELAYS_S = (10, 30, 90, 300, 900)  # then it fails: six tries over about 22 minutes
LEASE_S = 120  # longer than one attempt can take (SEND_TIMEOUT_S, Apprise's own timeouts)
SEND_TIMEOUT_S = 10
ERROR_MAX = 1000


def create_delivery(channel, message, *, group_key="", now):
    """A pending delivery of `message` (messages.alert_message's or test_message's), sent
    once the caller's transaction commits."""
    event_type, title, body, payload = message
    delivery = Delivery.objects.create(
        channel=channel, group_key=group_key, event_type=event_type, title=title[:300],
        body=body, payload=payload, created_at=now, next_attempt_at=now)
    enqueue(delivery.pk)
    return delivery


def enqueue(delivery_id):
    transaction.on_commit(lambda: current_app.send_task(
        DELIVER_TASK, args=[delivery_id], queue=settings.NOTIFY_QUEUE))


def claim(delivery_id, now):
    """Take the delivery for one attempt; False when it is not due, or another has it."""
    due = (Q(status=Delivery.Status.PENDING, next_attempt_at__lte=now)
           | Q(status=Delivery.Status.SENDING, lease_until__lt=now))
    return bool(Delivery.objects.filter(due, pk=delivery_id).update(
        status=Delivery.Status.SENDING, lease_until=now + timedelta(seconds=LEASE_S),
        attempts=F("attempts") + 1, last_attempt_at=now))


@dataclass(frozen=True)
class Outcome:
    ok: bool
    response_code: int | None = None
    error: str = ""


def deliver(delivery_id, now=None):
    """One attempt at the delivery, if it is due and nobody else has it. Returns the
    delivery as it stands after, or None when it was not this call's to send."""
    now = now or timezone.now()
    if not claim(delivery_id, now):
        return None
    delivery = Delivery.objects.select_related("channel", "channel__cluster").get(pk=delivery_id)
    try:
        outcome = send(delivery.channel, delivery)
    except SecretsUnavailable as exc:
        outcome = Outcome(False, error=str(exc))
    except Exception as exc:  # a bug or a library's surprise: logged, and tried again
        logger.exception("delivery %s to channel %s", delivery.message_id, delivery.channel_id)
        outcome = Outcome(False, error=f"{type(exc).__name__}: {exc}")
    return finish(delivery, outcome, timezone.now())


def finish(delivery, outcome, now):
    """Record the attempt, unless its lease ran out meanwhile and another attempt took the
    delivery over (that one records its own)."""
    claimed_until = delivery.lease_until
    delivery.response_code, delivery.error = outcome.response_code, outcome.error[:ERROR_MAX]
    delivery.lease_until = None
    if outcome.ok:
        delivery.status, delivery.sent_at = Delivery.Status.SENT, now
    elif delivery.attempts > len(RETRY_DELAYS_S):
        delivery.status = Delivery.Status.FAILED
    else:
        delivery.status = Delivery.Status.PENDING
        delivery.next_attempt_at = now + timedelta(seconds=RETRY_DELAYS_S[delivery.attempts - 1])
    recorded = Delivery.objects.filter(
        pk=delivery.pk, status=Delivery.Status.SENDING, lease_until=claimed_until).update(
        status=delivery.status, sent_at=delivery.sent_at, next_attempt_at=delivery.next_attempt_at,
        lease_until=None, response_code=delivery.response_code, error=delivery.error)
    if not recorded:
        logger.warning("delivery %s: attempt %s outlived its lease; another attempt has it",
                       delivery.message_id, delivery.attempts)
    elif not outcome.ok:
        logger.warning("delivery %s to channel %s, attempt %s: %s", delivery.message_id,
                       delivery.channel_id, delivery.attempts, delivery.error)
    return delivery


# A pending delivery due this long, and not yet taken, gets a new task message (its own
# was lost, or the workers are behind: then one extra message a minute, not one a sweep).
REQUEUE_AFTER = timedelta(seconds=60)


def retry_due(now=None):
    """Beat: queue what is due (a retry's time came, a lease ran out, a task message was
    lost). Returns how many were queued."""
    now = now or timezone.now()
    retry = Q(status=Delivery.Status.PENDING, attempts__gt=0, next_attempt_at__lte=now)
    lost = Q(status=Delivery.Status.PENDING, next_attempt_at__lte=now - REQUEUE_AFTER)
    due = Delivery.objects.filter(retry | lost | Q(status=Delivery.Status.SENDING,
                                                     lease_until__lt=now)).values_list(
        "pk", flat=True)
    ids = list(due[:500])
    for delivery_id in ids:
        current_app.send_task(DELIVER_TASK, args=[delivery_id], queue=settings.NOTIFY_QUEUE)
    return len(ids)


def send(channel, delivery):
    url = value_of(channel.url_secret)
    if not url:
        return Outcome(False, error=f"the channel's URL is missing from the secrets store "
                                    f"({channel.url_secret}): edit the channel to set it")
    if channel.kind == Channel.Kind.WEBHOOK:
        return send_webhook(channel, delivery, url)
    return send_apprise(delivery, url)


def send_apprise(delivery, url):
    notifier = apprise.Apprise()
    if not notifier.add(url):
        return Outcome(False, error="Apprise does not understand the channel's URL")
    with apprise.LogCapture(level=apprise.logging.WARNING) as log:
        sent = notifier.notify(title=delivery.title, body=delivery.body,
                               body_format=apprise.NotifyFormat.MARKDOWN)
    if sent:
        return Outcome(True)
    return Outcome(False, error=redacted(log.getvalue().strip(), url)
                   or "Apprise says the message was not sent")


def redacted(text, url):
    """`text` without the URL or any of its longer parts (tokens, paths, passwords)."""
    for part in sorted({url, *re.split(r"[/?&=:@#]", url)}, key=len, reverse=True):
        if len(part) >= 4 and part not in ("http", "https", "mailto", "mailtos"):
            text = text.replace(part, "…")
    return text[-300:]


def signing_keys(channel, now):
    """The keys a webhook is signed with: the current one, and the one before it until its
    overlap after a rotation ends (receivers move to the new key meanwhile)."""
    names = [channel.signing_secret]
    if channel.previous_signing_secret and channel.previous_signing_until and \
            channel.previous_signing_until > now:
        names.append(channel.previous_signing_secret)
    return [key for key in (value_of(name) for name in names) if key]


def webhook_request(channel, delivery, now):
    """(body, headers) of a Standard Webhooks request: signed over the id, this attempt's
    timestamp and the body, with every key of signing_keys()."""
    body = json.dumps(delivery.payload, separators=(",", ":"), sort_keys=True)
    at = datetime.fromtimestamp(int(now.timestamp()), tz=dt_timezone.utc)
    keys = signing_keys(channel, now)
    if not keys:
        raise SecretsUnavailable(f"the channel's signing key is missing from the secrets "
                                 f"store ({channel.signing_secret}): rotate it")
    signatures = [Webhook(key).sign(str(delivery.message_id), at, body) for key in keys]
    headers = {"content-type": "application/json", "user-agent": "clusterui",
               "webhook-id": str(delivery.message_id),
               "webhook-timestamp": str(int(at.timestamp())),
               "webhook-signature": " ".join(signatures)}
    return body, headers


def send_webhook(channel, delivery, url):
    body, headers = webhook_request(channel, delivery, timezone.now())
    try:
        response = requests.post(url, data=body.encode(), headers=headers,
                                 timeout=SEND_TIMEOUT_S, allow_redirects=False)
    except requests.RequestException as exc:
        # Not str(exc): it names the URL, whose path or query may be the receiver's secret.
        cause = re.search(r"\[Errno -?\d+\] [^'\")]+|timed out|Name or service not known",
                          str(exc))
        return Outcome(False, error=f"{type(exc).__name__}: no answer from "
                                    f"{urlsplit(url).hostname}"
                                    f"{': ' + cause.group(0) if cause else ''}")
    if 200 <= response.status_code < 300:
        return Outcome(True, response.status_code)
    return Outcome(False, response.status_code,
                   f"HTTP {response.status_code}: {response.text[:300]}".strip())
