"""Making, checking and revoking API tokens. A token is shown once, at its making; only its
SHA-256 is kept. Every change is on the audit trail."""

import hashlib
import secrets
from datetime import datetime, timedelta

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone

from clusters.services import record_audit

from .models import ApiToken

TOKEN_PREFIX = "cui_"
# last_used_at is written at most this often per token: not a write per request.
LAST_USED_RESOLUTION = timedelta(seconds=60)


def hashed(plaintext):
    return hashlib.sha256(plaintext.encode()).hexdigest()


@transaction.atomic
def do_create_api_token(user, *, name: str, expires_in_days, request: HttpRequest | None = None,
                        now: datetime | None = None) -> tuple[ApiToken, str]:
    """(the token, its plaintext: shown once)."""
    now = now or timezone.now()
    prefix = secrets.token_hex(4)
    plaintext = f"{TOKEN_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
    token = ApiToken.objects.create(user=user, name=name, prefix=prefix,
                                    secret_hash=hashed(plaintext), created_at=now,
                                    expires_at=now + timedelta(days=expires_in_days))
    record_audit(user, "apitoken.create", token, request=request, now=now,
                 changes={"name": name, "prefix": prefix,
                          "expires_at": token.expires_at.isoformat()})
    return token, plaintext


@transaction.atomic
def do_revoke_api_token(token, *, actor: AbstractBaseUser, request: HttpRequest | None = None,
                        now: datetime | None = None) -> bool:
    now = now or timezone.now()
    revoked = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=now)
    if revoked:
        record_audit(actor, "apitoken.revoke", token, request=request, now=now,
                     changes={"name": token.name, "prefix": token.prefix,
                              "owner": token.user.get_username()})
    return bool(revoked)


def find_usable_token(plaintext, now=None):
    """The usable token for `plaintext` (its user loaded), or None; notes its use."""
    if not plaintext or not plaintext.startswith(TOKEN_PREFIX):
        return None
    now = now or timezone.now()
    token = (ApiToken.objects.usable(now).select_related("user")
             .filter(secret_hash=hashed(plaintext)).first())
    if token is not None and (token.last_used_at is None
                              or token.last_used_at < now - LAST_USED_RESOLUTION):
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token
