"""Limits on password guessing, for the local sign-in form and the break-glass sign-in.

Every refused password sign-in is a FailedSignIn row. An account name tried from one
source address CLUSTERUI_SIGN_IN_MAX_FAILURES times within CLUSTERUI_SIGN_IN_LOCKOUT_S, or a
source address that reached CLUSTERUI_SIGN_IN_MAX_FAILURES_PER_ADDRESS over any names, is
locked: its sign-ins are refused without the password being looked at until the oldest of
those refusals leaves the window. Attempts refused while locked do not count, and write
nothing: a locked address hammering the form costs a read per attempt, and the audit trail
has one row for the lockout (the refusal that began it), not one per attempt.

The account is locked only from the address that guessed: the break-glass account is for
when the identity provider is down, and anyone who can reach the form could otherwise keep
the admins out. The rows live in the database, so every server process counts together.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from .models import FailedSignIn


@dataclass(frozen=True)
class Lockout:
    reason: str  # for the audit trail: which limit was reached
    until: datetime  # when the next attempt will be looked at

    @property
    def message(self):
        local = timezone.localtime(self.until)
        return (f"Too many failed sign-ins; try again after {local:%H:%M:%S %Z}. "
                f"An admin can see the attempts in the audit trail.")


def _window(now):
    return now - timedelta(seconds=settings.CLUSTERUI_SIGN_IN_LOCKOUT_S)


def _lockout_by(failures, limit, now):
    """The time the limit stops holding, if `failures` (newest first) reach it."""
    times = list(failures.filter(at__gt=_window(now)).order_by("-at")
                 .values_list("at", flat=True)[:limit])
    if len(times) < limit:
        return None
    return times[-1] + timedelta(seconds=settings.CLUSTERUI_SIGN_IN_LOCKOUT_S)


def lockout(username, source_ip, *, now=None):
    """A Lockout when sign-ins of `username` from `source_ip` are refused now; else None."""
    now = now or timezone.now()
    from_address = FailedSignIn.objects.filter(source_ip=source_ip)
    until = _lockout_by(from_address.filter(username=username.casefold()),
                        settings.CLUSTERUI_SIGN_IN_MAX_FAILURES, now)
    if until is not None:
        return Lockout("too many failed sign-ins for this account from this address", until)
    until = _lockout_by(from_address, settings.CLUSTERUI_SIGN_IN_MAX_FAILURES_PER_ADDRESS, now)
    if until is not None:
        return Lockout("too many failed sign-ins from this address", until)
    return None


def record_failed_sign_in(username, source_ip, *, now=None):
    """Count a refused password. Returns the Lockout this refusal began, or None."""
    now = now or timezone.now()
    FailedSignIn.objects.filter(at__lte=_window(now)).delete()
    FailedSignIn.objects.create(at=now, username=username.casefold(), source_ip=source_ip)
    return lockout(username, source_ip, now=now)


def forget_failed_sign_ins(username, source_ip):
    """A successful sign-in starts its account's count from that address again."""
    FailedSignIn.objects.filter(username=username.casefold(), source_ip=source_ip).delete()
