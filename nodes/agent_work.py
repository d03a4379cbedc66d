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

from clusters.change_feed import Kind, record_change


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
    record_change(Kind.AGENT_WORK, cluster_id=work.node.cluster_id, node_id=work.node_id,
                  object_id=f"{kind.name}:{work.pk}", now=now)


def parse_offer(object_id):
    """(kind name, work id) of an AGENT_WORK change's object_id."""
    name, _, pk = object_id.partition(":")
    return name, int(pk)


def do_mark_sent(kind, node_id, work_id, now: datetime | None = None) -> dict | None:
    """The work's frame, marked as handed to the agent's connection; None when it is
    answered or finished, past its deadline, or not this node's."""
    now = now or timezone.now()
    sendable = kind.model.objects.filter(pk=work_id, node_id=node_id,
                                         status__in=kind.unanswered, deadline_at__gt=now)
    if not sendable.update(status=kind.sent, sent_at=now):
        return None
    return kind.frame(kind.model.objects.get(pk=work_id))


def unanswered_ids(kind, node_id):
    """The node's work of this kind that goes out (again) after a hello, oldest first."""
    return list(kind.model.objects.filter(node_id=node_id, status__in=kind.unanswered)
                .order_by("id").values_list("id", flat=True))


def frames_for(kind, node_id, work_ids, now=None):
    """Frames to send on the node's connection for these ids, each marked as sent."""
    frames = (do_mark_sent(kind, node_id, work_id, now=now) for work_id in work_ids)
    return [frame for frame in frames if frame is not None]


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
