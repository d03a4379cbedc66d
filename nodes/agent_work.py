"""Work for a node's agent: the one mechanism behind active check runs (healthchecks,
PROTOCOL.md `run_check`) and commands (nodes.services, PROTOCOL.md `command`).

    queued  --a frame handed to the agent's connection-->  sent  --the agent answers-->  ...
    queued or sent, past its deadline  -->  timed out (expire_work, a beat task per kind)

Work goes out as soon as it is queued if the node's agent is connected: queue_work()
appends a change row in the queuing transaction, and the publisher offers it to the
connection wherever it is served. An agent not connected gets it after its next hello
(frames_after_hello). After a reconnect, only work never answered goes out again: the
agent answers an id it has seen with its earlier answer and does not act twice.

Each kind (WorkKind) says only what differs: its model, statuses, frame, why it was late,
and what follows a hello or an expiry.
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from clusters.change_feed import Kind, record_changes


@dataclass(frozen=True)
class WorkKind:
    name: str  # the change feed's object_id prefix, and the offer's "kind"
    model: type  # an AgentWork model
    unanswered: tuple  # statuses that go out (again), at a hello or when offered
    unfinished: tuple  # statuses that a deadline times out
    sent: str
    timed_out: str
    frame: Callable  # work -> the frame sent to the agent
    why_late: Callable  # work -> the timed-out message
    # Before a hello's frames are picked: finish what the hello shows done (node_id, now).
    after_hello: Callable | None = None
    # At a deadline: True when the work turned out done after all (work, now).
    done_otherwise: Callable | None = None
    # After the work finished by timing out (work, now).
    after_timeout: Callable | None = None


def queue_work(kind, work, now=None):
    """Once the queuing transaction commits, the publisher offers `work` to the node's
    agent connection (in the caller's transaction)."""
    queue_works(kind, [work], now=now)


def queue_works(kind, works, now=None):
    """queue_work() of several pieces of work: one statement."""
    record_changes(Kind.AGENT_WORK, [(work.node.cluster_id, work.node_id,
                                      f"{kind.name}:{work.pk}") for work in works], now=now)


def parse_offer(object_id):
    """(kind name, work id) of an AGENT_WORK change's object_id."""
    name, _, pk = object_id.partition(":")
    return name, int(pk)


def unanswered_ids(kind, node_id):
    """The node's work of this kind that goes out (again) after a hello, oldest first."""
    return list(kind.model.objects.filter(node_id=node_id, status__in=kind.unanswered)
                .order_by("id").values_list("id", flat=True))


def frames_for(kind, node_id, work_ids, now=None):
    """Frames to send on the node's connection for these ids, in their order, each marked as
    sent; none for work answered or finished, past its deadline, or not this node's. Three
    statements however many (an acceptance battery after a join is several)."""
    now = now or timezone.now()
    with transaction.atomic():
        sendable = list(kind.model.objects.select_for_update().filter(
            pk__in=list(work_ids), node_id=node_id, status__in=kind.unanswered,
            deadline_at__gt=now))
        kind.model.objects.filter(pk__in=[work.pk for work in sendable]).update(
            status=kind.sent, sent_at=now)
    order = {work_id: position for position, work_id in enumerate(work_ids)}
    frames = []
    for work in sorted(sendable, key=lambda work: order[work.pk]):
        work.status, work.sent_at = kind.sent, now
        frames.append(kind.frame(work))
    return frames


def frames_after_hello(kinds, node_id, now=None):
    """Every unanswered piece of work of these kinds, in order, once each kind has finished
    what the hello shows done (a reboot is never sent again to a node that rebooted)."""
    frames = []
    for kind in kinds:
        if kind.after_hello is not None:
            kind.after_hello(node_id, now)
        frames += frames_for(kind, node_id, unanswered_ids(kind, node_id), now=now)
    return frames


def finish(kind, work, status, message, now):
    """Conditional: only unfinished work finishes, once. True when this call did."""
    return bool(kind.model.objects.filter(pk=work.pk, status__in=kind.unfinished)
                .update(status=status, message=message, finished_at=now))


def expire_work(kind, now=None):
    """Work past its deadline times out (or, where the kind says so, turns out done).
    Returns how many timed out."""
    now = now or timezone.now()
    expired = 0
    due = kind.model.objects.filter(status__in=kind.unfinished, deadline_at__lte=now)
    for work in due.select_related("node").order_by("id"):
        with transaction.atomic():
            if kind.done_otherwise is not None and kind.done_otherwise(work, now):
                continue
            if finish(kind, work, kind.timed_out, kind.why_late(work), now):
                expired += 1
                if kind.after_timeout is not None:
                    kind.after_timeout(work, now)
    return expired
