"""The secrets store: named credentials for provider commands, startup scripts and
notification channels. One home for them (issue 15, point 8).

    do_set_secret("IPMI_PASSWORD", "hunter2", actor=admin)    # create, or replace the value
    values_referenced_in("ipmitool -P \"$IPMI_PASSWORD\" ...")   # {"IPMI_PASSWORD": "hunter2"}

Values are encrypted at rest with Fernet (the `cryptography` package), under the keys of
CLUSTERUI_SECRETS_KEYS: a MultiFernet, so a new key goes first, `manage.py rotate_secrets`
re-encrypts every value under it, and the old key can then be dropped. The keys come from
the settings (or a _FILE), never the database. A value is written by admins and never read
back by anyone: it leaves this module only as an environment variable of a provider command
or a startup script that names it ($NAME or ${NAME}), and those mask it in what they print,
or as a notification channel's URL or signing key at the moment a message is sent.
"""

import os
import re
from datetime import datetime
from functools import cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone

from .models import Secret
from .services import record_audit

REFERENCE = re.compile(r"\$(?:\{([A-Z][A-Z0-9_]{0,63})\}|([A-Z][A-Z0-9_]{0,63}))")
MASK = "<secret {name}>"


class SecretsUnavailable(Exception):
    """No key, or a key that does not open a stored value: says which, for the operator."""


def _keys():
    if settings.CLUSTERUI_SECRETS_KEYS:
        return settings.CLUSTERUI_SECRETS_KEYS
    path = settings.CLUSTERUI_SECRETS_KEY_FILE
    if path is None:
        raise SecretsUnavailable("no key for the secrets store: set CLUSTERUI_SECRETS_KEYS (or "
                                 "CLUSTERUI_SECRETS_KEYS_FILE) to Fernet keys")
    if not path.exists():  # embedded mode: made once, readable by this user only
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(Fernet.generate_key().decode() + "\n")
    return [path.read_text().strip()]


@cache
def _fernet_for(keys):
    try:
        return MultiFernet([Fernet(key) for key in keys])
    except ValueError as exc:
        raise ImproperlyConfigured(f"CLUSTERUI_SECRETS_KEYS: not Fernet keys ({exc})") from None


def fernet():
    return _fernet_for(tuple(_keys()))


@transaction.atomic
def do_set_secret(name: str, value, *, actor: AbstractBaseUser, description="",
                  request: HttpRequest | None = None,
                  now: datetime | None = None) -> tuple[Secret, bool]:
    """Create the secret, or replace its value (and description). Returns (secret, created).
    The audit trail says who and when, never the value."""
    now = now or timezone.now()
    secret, created = store_secret(name, value, description=description,
                                   by_name=actor.get_username(), now=now)
    record_audit(actor, "secret.create" if created else "secret.replace", secret,
                 request=request, now=now, changes={"name": name, "description": description})
    return secret, created


def store_secret(name, value, *, description, by_name, now):
    """do_set_secret() without its audit row, for a service whose own audit row says what
    the secret is for (a notification channel's URL). Returns (secret, created)."""
    ciphertext = fernet().encrypt(value.encode()).decode()
    secret, created = Secret.objects.select_for_update().get_or_create(
        name=name, defaults={"ciphertext": ciphertext, "description": description,
                             "created_at": now, "updated_at": now, "updated_by_name": by_name})
    if not created:
        secret.ciphertext, secret.description = ciphertext, description
        secret.updated_at, secret.updated_by_name = now, by_name
        secret.save(update_fields=["ciphertext", "description", "updated_at",
                                   "updated_by_name"])
    return secret, created


@transaction.atomic
def do_delete_secret(secret, *, actor: AbstractBaseUser,
                     request: HttpRequest | None = None) -> None:
    record_audit(actor, "secret.delete", secret, request=request, changes={"name": secret.name})
    secret.delete()


def referenced_names(text):
    """The names `text` refers to as $NAME or ${NAME}."""
    return {braced or bare for braced, bare in REFERENCE.findall(text or "")}


def values_referenced_in(*texts):
    """{name: value} of every stored secret the texts name ($NAME, ${NAME}); a name that is
    no secret is left to the shell (an ordinary variable). Raises SecretsUnavailable when a
    value cannot be opened (the key is missing or changed)."""
    names = set().union(*(referenced_names(text) for text in texts))
    if not names:
        return {}
    values, keys = {}, None
    for secret in Secret.objects.filter(name__in=names):
        keys = keys or fernet()
        values[secret.name] = _opened(secret, keys)
    return values


def _opened(secret, keys):
    try:
        return keys.decrypt(secret.ciphertext.encode()).decode()
    except InvalidToken:
        raise SecretsUnavailable(f"secret {secret.name} does not open with the keys of "
                                 f"CLUSTERUI_SECRETS_KEYS (a key was dropped too soon?)") from None


def value_of(name):
    """The value of one secret (a notification channel's URL or signing key, as it sends),
    or None when there is no such secret."""
    secret = Secret.objects.filter(name=name).first()
    return None if secret is None else _opened(secret, fernet())


def seal(value: str) -> str:
    """`value` encrypted under the store's keys, for a page to carry from one step of a form
    to the next without holding the value itself in its HTML (the creation page's review)."""
    return fernet().encrypt(value.encode()).decode()


def unseal(token: str, *, max_age_s: int) -> str | None:
    """What seal() sealed, or None when `token` is not one of its tokens, or is older than
    max_age_s."""
    try:
        return fernet().decrypt(token.encode(), ttl=max_age_s).decode()
    except InvalidToken:
        return None


def masked(text, values):
    """`text` with each secret value in it replaced by <secret NAME>."""
    for name, value in sorted(values.items(), key=lambda item: -len(item[1])):
        if value:
            text = text.replace(value, MASK.format(name=name))
    return text


@transaction.atomic
def rotate_all():
    """Re-encrypt every value under the first key; how many."""
    rotated, keys = 0, fernet()
    for secret in Secret.objects.select_for_update():
        try:
            ciphertext = keys.rotate(secret.ciphertext.encode()).decode()
        except InvalidToken:
            raise SecretsUnavailable(f"secret {secret.name} does not open with any key of "
                                     f"CLUSTERUI_SECRETS_KEYS") from None
        Secret.objects.filter(pk=secret.pk).update(ciphertext=ciphertext)
        rotated += 1
    return rotated
