"""GPU-hours and cost per user and per account over a period.

A job counts gpus x the overlap of [start, end or now] with the period, so a job that
spans the period's edges counts only the part inside it.
"""

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from django.db.models import Q

CENTS = Decimal("0.01")


@dataclass
class Usage:
    name: str
    jobs: int = 0
    gpu_seconds: int = 0

    @property
    def gpu_hours(self):
        return (Decimal(self.gpu_seconds) / 3600).quantize(CENTS, ROUND_HALF_UP)


def gpu_seconds_in_period(gpus, start, end, period_start, period_end, now):
    if start is None or not gpus:
        return 0
    overlap = min(end or now, period_end) - max(start, period_start)
    return gpus * max(0, int(overlap.total_seconds()))


def cost(gpu_seconds, rate):
    return (Decimal(gpu_seconds) * rate / 3600).quantize(CENTS, ROUND_HALF_UP)


def overlapping(jobs, period_start, period_end):
    """The jobs that ran at some time in the period."""
    return jobs.filter(start__isnull=False, start__lt=period_end).filter(
        Q(end__isnull=True) | Q(end__gt=period_start))


def usage_by_user_and_account(jobs, period_start, period_end, now):
    """({user: Usage}, {account: Usage}) of `jobs` (already overlapping(), as the Jobs page
    lists them) with GPUs, counted inside the period; one query."""
    users, accounts = {}, {}
    rows = jobs.filter(gpus__gt=0).values_list("user", "account", "gpus", "start", "end")
    for user, account, gpus, start, end in rows:
        seconds = gpu_seconds_in_period(gpus, start, end, period_start, period_end, now)
        for table, key in ((users, user), (accounts, account)):
            usage = table.setdefault(key, Usage(key))
            usage.jobs += 1
            usage.gpu_seconds += seconds
    return (sorted(users.values(), key=lambda u: (-u.gpu_seconds, u.name)),
            sorted(accounts.values(), key=lambda u: (-u.gpu_seconds, u.name)))
