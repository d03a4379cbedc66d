"""Commands to a node's agent (PROTOCOL.md `command` / `command_result`)."""

from datetime import datetime, timedelta

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone

from clusters.services import record_audit

from .. import agent_work
from ..models import AgentCommand, Node


def command_frame(command):
    return {"type": "command", "id": command.pk, "action": command.action,
            "params": command.params}


def _rebooted_since(command, node):
    # No boot id when asked: the node never said hello before, and nothing tells its boots apart.
    return (command.action == AgentCommand.Action.REBOOT and command.boot_id_before != ""
            and node.boot_id != command.boot_id_before)


def finish_reboots_after_hello(node_id, now=None):
    """The node's unfinished reboots, done if it has said hello with a new boot id since
    they were asked. Returns how many finished."""
    now = now or timezone.now()
    node = Node.objects.get(pk=node_id)
    finished = 0
    for command in AgentCommand.objects.unfinished().filter(node=node):
        if _rebooted_since(command, node):
            finished += agent_work.finish(COMMANDS, command, AgentCommand.Status.OK,
                                          "the node rebooted", now)
    return finished


def _done_at_deadline(command, now):
    """A reboot whose node came back with a new boot id (a hello whose commands were not
    looked at) is done, not timed out."""
    if not _rebooted_since(command, command.node):
        return False
    agent_work.finish(COMMANDS, command, AgentCommand.Status.OK, "the node rebooted", now)
    return True


def _why_late(command):
    if command.status == AgentCommand.Status.QUEUED:
        return "not sent in time: the node's agent was not connected"
    if command.status == AgentCommand.Status.SENT:
        return "no answer in time from the node's agent"
    if command.action == AgentCommand.Action.REBOOT:
        return "the node did not come back with a new boot id in time"
    return "accepted, but not finished in time"


COMMANDS = agent_work.WorkKind(
    name="command", model=AgentCommand, unanswered=AgentCommand.UNANSWERED,
    unfinished=AgentCommand.UNFINISHED, sent=AgentCommand.Status.SENT,
    timed_out=AgentCommand.Status.TIMED_OUT, frame=command_frame, why_late=_why_late,
    after_hello=finish_reboots_after_hello, done_otherwise=_done_at_deadline,
)


@transaction.atomic
def do_send_command(node: Node, action, *, params=None, actor: AbstractBaseUser | None = None,
                    deadline_s=None, request: HttpRequest | None = None,
                    now: datetime | None = None) -> AgentCommand:
    """Ask the node's agent to carry out `action` (AgentCommand.Action). While a command of
    the same action is unfinished on the node, that one is returned and no second one is
    made: a repeated request (a retried repair step, a double click) does not reboot twice.
    `actor` None: the system (a repair)."""
    if action not in AgentCommand.Action.values:
        raise ValueError(f"unknown command action {action!r}")
    now = now or timezone.now()
    node = Node.objects.select_for_update(no_key=True).get(pk=node.pk)
    unfinished = AgentCommand.objects.unfinished().filter(node=node, action=action).first()
    if unfinished is not None:
        return unfinished
    if deadline_s is None:
        deadline_s = AgentCommand.DEFAULT_DEADLINE_S[action]
    command = AgentCommand.objects.create(
        node=node, action=action, params=params or {}, requested_by=actor, requested_at=now,
        deadline_at=now + timedelta(seconds=deadline_s), boot_id_before=node.boot_id,
    )
    if actor is not None:
        record_audit(actor, "agentcommand.send", command, cluster=node.cluster, request=request,
                     changes={"node": node.name, "action": action, "params": command.params},
                     now=now)
    agent_work.queue_work(COMMANDS, command, now=now)
    return command


def do_record_command_result(node: Node, *, command_id, status, message="",
                             now: datetime | None = None) -> AgentCommand | None:
    """An agent's command_result. Returns the command, or None when the node has no such
    command. `accepted` moves a command not yet answered to accepted; `ok` and `failed`
    finish an unfinished one. An answer to a finished command changes nothing (a late
    answer after its deadline, an `accepted` after the node came back rebooted)."""
    now = now or timezone.now()
    command = AgentCommand.objects.filter(pk=command_id, node=node).first()
    if command is None:
        return None
    if status == AgentCommand.Status.ACCEPTED:
        AgentCommand.objects.filter(pk=command.pk, status__in=AgentCommand.UNANSWERED).update(
            status=AgentCommand.Status.ACCEPTED, message=message)
    else:
        agent_work.finish(COMMANDS, command, status, message, now)
    command.refresh_from_db()
    return command
