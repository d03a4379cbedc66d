"""Writes that matter for clusters, and the audit trail every change goes through."""

import ipaddress
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone
from django.forms.models import model_to_dict

from .models import AuditEntry, Cluster


def actor_name(actor):
    return actor.get_username() if actor is not None else "system"


def client_ip(request):
    """The address of the person behind `request`: the socket's peer, or, when that is one of
    CLUSTERUI_TRUSTED_PROXIES, the rightmost X-Forwarded-For address that is not (each proxy
    appends the address it got the request from; the leftmost is whatever the client wrote).
    An entry that is not an address ends the walk at the proxy that passed it on."""
    if request is None:
        return None
    address = _address(request.META.get("REMOTE_ADDR"))
    if address is None:
        return None
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    hops = forwarded.split(",") if forwarded else []
    while hops and _trusted_proxy(address):
        hop = _address(hops.pop())
        if hop is None:
            break
        address = hop
    return str(address)


def _address(text):
    try:
        address = ipaddress.ip_address((text or "").strip())
    except ValueError:
        return None
    return getattr(address, "ipv4_mapped", None) or address


def _trusted_proxy(address):
    return any(address in network for network in settings.CLUSTERUI_TRUSTED_PROXIES)


def prune_audit(now=None):
    """Audit entries older than CLUSTERUI_AUDIT_RETENTION_DAYS go; none while it is unset.
    Returns how many."""
    if settings.CLUSTERUI_AUDIT_RETENTION_DAYS is None:
        return 0
    now = now or timezone.now()
    cutoff = now - timedelta(days=settings.CLUSTERUI_AUDIT_RETENTION_DAYS)
    # The one delete the append-only trail allows (AuditEntryQuerySet refuses the rest).
    deleted, _ = AuditEntry._base_manager.filter(at__lt=cutoff).delete()
    return deleted


def record_audit(actor, action, obj, *, changes=None, cluster=None, request=None, now=None):
    return AuditEntry.objects.create(
        at=now or timezone.now(),
        actor=actor,
        actor_name=actor_name(actor),
        action=action,
        object_type=obj._meta.label_lower,
        object_id=str(obj.pk),
        object_repr=str(obj)[:200],
        changes=changes or {},
        source_ip=client_ip(request),
        cluster=cluster,
    )


def configuration_of(cluster):
    values = model_to_dict(cluster, fields=Cluster.CONFIGURATION_FIELDS)
    return {k: str(v) if not isinstance(v, (bool, int, str)) else v for k, v in values.items()}


@transaction.atomic
def do_create_cluster(form, *, actor: AbstractBaseUser | None,
                      request: HttpRequest | None = None) -> Cluster:
    cluster = form.save(commit=False)
    cluster.created_by = actor
    cluster.save()
    cluster.refresh_from_db()
    record_audit(
        actor,
        "cluster.create",
        cluster,
        changes={"after": configuration_of(cluster)},
        cluster=cluster,
        request=request,
    )
    return cluster


@transaction.atomic
def do_update_cluster(form, *, actor: AbstractBaseUser,
                      request: HttpRequest | None = None) -> tuple[Cluster, dict]:
    """Save an edited configuration; the audit entry holds each changed field before/after."""
    before = configuration_of(
        Cluster.objects.select_for_update(no_key=True).get(pk=form.instance.pk))
    cluster = form.save()
    cluster.refresh_from_db()  # as stored: 2.1 and 2.1000 are one billing rate
    after = configuration_of(cluster)
    changed = {k: {"before": before[k], "after": after[k]} for k in after if before[k] != after[k]}
    if changed:
        record_audit(
            actor, "cluster.update", cluster, changes=changed, cluster=cluster, request=request
        )
    return cluster, changed
