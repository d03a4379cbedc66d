"""A rejection sticks (DESIGN.md "Repairs"): after an operator rejects or cancels a
recommendation, no new one is proposed for the same open events until one of these:
- a new signature, or an action costlier than the rejected one, calls for a repair (the new
  recommendation says what is new);
- the snooze chosen at rejection ends (`Repair.snooze_until`; empty: until those events
  close);
- an operator asks for a recommendation again (services.do_recommend_again ends the snooze).
"""

from django.db.models import Prefetch, Q

from healthchecks.models import HealthEvent

from .choices import Status, cost
from .models import Repair

STICKING_STATUSES = (Status.REJECTED, Status.CANCELLED)


def rejections_in_force(node, now):
    """The node's rejected or cancelled repairs whose snooze has not ended, newest first,
    each with its events."""
    return list(
        Repair.objects.filter(node=node, status__in=STICKING_STATUSES)
        .filter(Q(snooze_until__gt=now)
                | Q(snooze_until__isnull=True, events__closed_at__isnull=True))
        .distinct().select_related("reviewed_by")
        .prefetch_related(Prefetch("events", queryset=HealthEvent.objects.only("pk")))
        .order_by("-finished_at", "-id"))


def holds_back(rejection, action, events):
    """Whether `rejection` holds back a recommendation of `action` for `events` (those that
    call for a repair): nothing new among them, and nothing costlier."""
    rejected = {event.pk for event in rejection.events.all()}
    return cost(action) <= cost(rejection.action) and all(e.pk in rejected for e in events)


def what_is_new(rejection, action, events):
    """Why a recommendation comes despite `rejection`, in words."""
    verdict = "rejected" if rejection.status == Status.REJECTED else "cancelled"
    rejected = {event.pk for event in rejection.events.all()}
    new = sorted({where(event) for event in events if event.pk not in rejected})
    parts = []
    if new:
        parts.append(f"new since #{rejection.pk} ({rejection.action}) was {verdict}: "
                     f"{', '.join(new)}")
    if cost(action) > cost(rejection.action):
        parts.append(f"{action} is costlier than the {rejection.action} that was {verdict} "
                     f"(#{rejection.pk})")
    return "; ".join(parts)


def where(event):
    return f"{event.signature} on GPU {event.gpu.index}" if event.gpu is not None \
        else event.signature

