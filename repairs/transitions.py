"""The repair state machine: DESIGN.md's status table, and the only function that moves a
repair from one status to another.

    proposed  -> approved | rejected | resolved | superseded | cancelled
    approved  -> waiting | running | cancelled
    waiting   -> running | cancelled
    running   -> succeeded | failed | aborted

(approved -> running directly when the blast-radius limit does not hold it back.)
"""

from django.db import transaction
from django.utils import timezone

from clusters.services import actor_name
from nodes.services import REPAIR_OPENER, do_close_rejoin
from nodes.states import refresh_node_state

from .choices import IN_SERVICE_ACTIONS, Status
from .announcements import announce_repair_change
from .models import Repair, RepairTransition

ALLOWED = {
    Status.PROPOSED: {Status.APPROVED, Status.REJECTED, Status.RESOLVED, Status.SUPERSEDED,
                      Status.CANCELLED},
    Status.APPROVED: {Status.WAITING, Status.RUNNING, Status.CANCELLED},
    Status.WAITING: {Status.RUNNING, Status.CANCELLED},
    Status.RUNNING: {Status.SUCCEEDED, Status.FAILED, Status.ABORTED},
    Status.SUCCEEDED: set(),
    Status.FAILED: set(),
    Status.REJECTED: set(),
    Status.RESOLVED: set(),
    Status.SUPERSEDED: set(),
    Status.CANCELLED: set(),
    Status.ABORTED: set(),
}


class InvalidTransition(Exception):
    """The table does not allow this move (say, approving a rejected repair)."""


class Conflict(Exception):
    """Someone else moved the repair first (two operators, a double click)."""

    def __init__(self, repair, wanted):
        self.repair = repair
        self.wanted = wanted
        super().__init__(f"repair #{repair.pk} is {repair.get_status_display()} now; "
                         f"it was not moved to {wanted}")


@transaction.atomic
def transition(repair, to, *, actor=None, reason="", now=None, **fields):
    """Move `repair` from the status it was read with to `to`, with `fields` updated in
    the same conditional UPDATE; append its RepairTransition row. Returns the repair as
    stored. Raises InvalidTransition, or Conflict when its status changed meanwhile."""
    now = now or timezone.now()
    current = repair.status
    if to not in ALLOWED[current]:
        raise InvalidTransition(f"a {current} repair cannot become {to}")
    moved = Repair.objects.filter(pk=repair.pk, status=current).update(status=to, **fields)
    if not moved:
        repair.refresh_from_db()
        raise Conflict(repair, to)
    RepairTransition.objects.create(repair=repair, from_status=current, to_status=to,
                                    actor=actor, actor_name=actor_name(actor),
                                    reason=reason[:500], at=now)
    repair.refresh_from_db()
    announce_repair_change(repair)
    if current == Status.RUNNING:
        # A reprovision's or failover's opening to re-join lasts as long as the repair.
        do_close_rejoin(repair.node, opened_by=REPAIR_OPENER.format(repair.pk), now=now,
                        reason=f"repair #{repair.pk} {to}")
    if Status.RUNNING in (current, to) and repair.action not in IN_SERVICE_ACTIONS:
        # A running repair pauses its node (DESIGN.md "Node states"): hand the fact down.
        running = f"repair #{repair.pk} ({repair.action}) is running" if to == Status.RUNNING else ""
        refresh_node_state(repair.node, actor=actor, now=now, running_repair=running,
                           reason=f"repair #{repair.pk} ({repair.action}) "
                                  f"{'started' if to == Status.RUNNING else to}")
    return repair
