"""Admins' changes to notification channels, each on the audit trail (never with a URL or a
key: those live in the secrets store, clusters/secret_store.py, and are never shown back)."""

import base64
import secrets as random_bytes
from datetime import datetime, timedelta
from urllib.parse import urlsplit

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone

from clusters.models import Cluster, Secret
from clusters.secret_store import store_secret, value_of
from clusters.services import record_audit
from healthchecks.choices import Severity

from .deliveries import create_delivery
from .messages import channel_test_message
from .models import Channel, Delivery, Rule

# After a rotation, webhooks carry the old key's signature too for this long.
SIGNING_OVERLAP = timedelta(hours=24)
TIMING_FIELDS = ("enabled", "group_wait_s", "group_interval_s", "repeat_interval_s",
                 "max_per_hour", "send_resolved")


def url_hint(kind, url):
    """What the page may show of a URL: its scheme, and for a webhook its host."""
    parts = urlsplit(url)
    if kind == Channel.Kind.WEBHOOK:
        return f"{parts.scheme}://{parts.hostname or ''}/…"
    return f"{parts.scheme}://…"


def new_signing_key():
    return "whsec_" + base64.b64encode(random_bytes.token_bytes(32)).decode()


def _secret_names(channel):
    prefix = f"NOTIFY_CHANNEL_{channel.pk}"
    return f"{prefix}_URL", f"{prefix}_SIGNING", f"{prefix}_SIGNING_PREVIOUS"


def _rules_summary(rules):
    return [{"kind": rule["kind"], "min_severity": rule.get("min_severity", Severity.WARNING),
             "signature_prefix": rule.get("signature_prefix", "")} for rule in rules]


def _set_rules(channel, rules):
    channel.rules.all().delete()
    Rule.objects.bulk_create([Rule(channel=channel, **rule) for rule in rules])


@transaction.atomic
def do_create_channel(cluster: Cluster, *, name: str, kind, url, rules, actor: AbstractBaseUser,
                      request: HttpRequest | None = None, now: datetime | None = None,
                      **timing) -> tuple[Channel, str | None]:
    """A channel with its rules; its URL (and a webhook's new signing key) go to the
    secrets store. Returns (channel, the signing key to show once, or None)."""
    now = now or timezone.now()
    channel = Channel.objects.create(cluster=cluster, name=name, kind=kind, url_secret="",
                                     url_hint=url_hint(kind, url), created_at=now,
                                     created_by_name=actor.get_username(), **timing)
    url_name, signing_name, _ = _secret_names(channel)
    store_secret(url_name, url, by_name=actor.get_username(), now=now,
                 description=f"notification channel {name}'s URL ({cluster.slug})")
    channel.url_secret = url_name
    key = None
    if kind == Channel.Kind.WEBHOOK:
        key = new_signing_key()
        store_secret(signing_name, key, by_name=actor.get_username(), now=now,
                     description=f"notification channel {name}'s signing key ({cluster.slug})")
        channel.signing_secret = signing_name
    channel.save(update_fields=["url_secret", "signing_secret"])
    _set_rules(channel, rules)
    record_audit(actor, "notification_channel.create", channel, cluster=cluster, request=request,
                 now=now, changes={"name": name, "kind": kind, "url": channel.url_hint,
                                   "rules": _rules_summary(rules),
                                   **{field: timing[field] for field in timing}})
    return channel, key


@transaction.atomic
def do_update_channel(channel, *, name: str, url, rules, actor: AbstractBaseUser,
                      request: HttpRequest | None = None, now: datetime | None = None,
                      **timing) -> list[str]:
    """Change the channel; an empty `url` keeps the stored one. Returns the fields changed."""
    now = now or timezone.now()
    channel = Channel.objects.select_for_update().get(pk=channel.pk)
    changes = {}
    if name != channel.name:
        changes["name"] = {"before": channel.name, "after": name}
        channel.name = name
    for field, value in timing.items():
        if getattr(channel, field) != value:
            changes[field] = {"before": getattr(channel, field), "after": value}
            setattr(channel, field, value)
    if url:
        before_hint = channel.url_hint
        channel.url_hint = url_hint(channel.kind, url)
        store_secret(channel.url_secret, url, by_name=actor.get_username(), now=now,
                     description=f"notification channel {channel.name}'s URL "
                                 f"({channel.cluster.slug})")
        changes["url"] = {"before": before_hint, "after": f"replaced ({channel.url_hint})"}
    before = _rules_summary(channel.rules.values("kind", "min_severity", "signature_prefix"))
    after = _rules_summary(rules)
    if sorted(before, key=str) != sorted(after, key=str):
        _set_rules(channel, rules)
        changes["rules"] = {"before": before, "after": after}
    channel.save()
    if changes:
        record_audit(actor, "notification_channel.update", channel, cluster=channel.cluster,
                     request=request, now=now, changes=changes)
    return list(changes)


@transaction.atomic
def do_delete_channel(channel, *, actor: AbstractBaseUser,
                      request: HttpRequest | None = None) -> None:
    record_audit(actor, "notification_channel.delete", channel, cluster=channel.cluster,
                 request=request, changes={"name": channel.name})
    Secret.objects.filter(name__in=_secret_names(channel)).delete()
    channel.delete()


@transaction.atomic
def do_rotate_signing_key(channel, *, actor: AbstractBaseUser, request: HttpRequest | None = None,
                          now: datetime | None = None) -> str:
    """A new signing key for a webhook channel; the old one still signs for SIGNING_OVERLAP,
    so receivers can move to the new one without missing a message. Returns the new key,
    to show once."""
    now = now or timezone.now()
    channel = Channel.objects.select_for_update().get(pk=channel.pk)
    if channel.kind != Channel.Kind.WEBHOOK:
        raise ValueError("only webhook channels have a signing key")
    _, signing_name, previous_name = _secret_names(channel)
    old = value_of(channel.signing_secret) if channel.signing_secret else None
    if old:
        store_secret(previous_name, old, by_name=actor.get_username(), now=now,
                     description=f"notification channel {channel.name}'s previous signing key")
        channel.previous_signing_secret = previous_name
        channel.previous_signing_until = now + SIGNING_OVERLAP
    key = new_signing_key()
    store_secret(signing_name, key, by_name=actor.get_username(), now=now,
                 description=f"notification channel {channel.name}'s signing key "
                             f"({channel.cluster.slug})")
    channel.signing_secret = signing_name
    channel.save(update_fields=["signing_secret", "previous_signing_secret",
                                "previous_signing_until"])
    record_audit(actor, "notification_channel.rotate_key", channel, cluster=channel.cluster,
                 request=request, now=now,
                 changes={"old_key_signs_until": channel.previous_signing_until.isoformat()
                          if old else None})
    return key


@transaction.atomic
def do_send_test(channel, *, actor: AbstractBaseUser, request: HttpRequest | None = None,
                 now: datetime | None = None) -> Delivery:
    """A test message to the channel, sent like any other (retried, logged)."""
    now = now or timezone.now()
    delivery = create_delivery(channel, channel_test_message(channel, actor.get_username(), now),
                               now=now)
    record_audit(actor, "notification_channel.test", channel, cluster=channel.cluster,
                 request=request, now=now, changes={"delivery": str(delivery.message_id)})
    return delivery
