"""Commands to a node's agent (PROTOCOL.md command / command_result): the service rules,
what goes out again after a reconnect, the rule that a node that rebooted is not rebooted
again, deadlines, and the same over the agent WebSocket."""

from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from clusters.models import AuditEntry
from nodes import agent_work, tasks
from nodes.models import AgentCommand, Node
from gateway.publisher import Publisher
from nodes.services import (
    COMMANDS,
    do_record_command_result,
    do_record_hello,
    do_register_node,
    do_send_command,
)
from gateway.tests.test_consumers import join, receive, send

db = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_boot_window(in_memory_channel_layer, settings):
    settings.CLUSTERUI_BOOT_WINDOW_S = 0


@pytest.fixture
def node(cluster):
    node = do_register_node(cluster, "gpu-001")
    do_record_hello(node, boot_id="boot-1")
    node.refresh_from_db()
    return node


def do_mark_command_sent(node_id, command_id, now=None):
    """The command's frame, marked as sent; None when it is not sendable."""
    frames = agent_work.frames_for(COMMANDS, node_id, [command_id], now=now)
    return frames[0] if frames else None


def expire_commands(now=None):
    return agent_work.expire_work(COMMANDS, now=now)


def unfinished_command_ids(node_id):
    return agent_work.unanswered_ids(COMMANDS, node_id)


def command_frames_for(node_id):
    """What a hello sends of the node's commands."""
    return agent_work.frames_after_hello([COMMANDS], node_id)


def reload(command):
    command.refresh_from_db()
    return command


# The services


@db
def test_a_command_is_queued_with_the_nodes_boot_id_and_its_deadline_and_audited(node, operator):
    now = timezone.now()
    command = do_send_command(node, "reboot", actor=operator, now=now)
    assert command.status == AgentCommand.Status.QUEUED
    assert command.boot_id_before == "boot-1"
    assert command.params == {}
    assert command.requested_by == operator and command.requested_at == now
    assert command.deadline_at == now + timedelta(minutes=15)
    entry = AuditEntry.objects.get(action="agentcommand.send")
    assert entry.actor == operator and entry.changes == {
        "node": "gpu-001", "action": "reboot", "params": {}}


@db
def test_a_system_command_has_no_requester_and_no_audit_entry(node):
    command = do_send_command(node, "reboot", deadline_s=60)
    assert command.requested_by is None
    assert command.deadline_at == command.requested_at + timedelta(seconds=60)
    assert not AuditEntry.objects.exists()


@db
def test_an_unknown_action_is_refused(node):
    with pytest.raises(ValueError, match="unknown command action 'poweroff'"):
        do_send_command(node, "poweroff")
    assert not AgentCommand.objects.exists()


@db
def test_asking_again_while_one_is_unfinished_returns_that_one(node, operator):
    first = do_send_command(node, "reboot")
    do_mark_command_sent(node.pk, first.pk)
    do_record_command_result(node, command_id=first.pk, status="accepted")
    assert do_send_command(node, "reboot", actor=operator) == first
    assert AgentCommand.objects.count() == 1

    do_record_command_result(node, command_id=first.pk, status="failed", message="no")
    second = do_send_command(node, "reboot")
    assert second != first and second.status == AgentCommand.Status.QUEUED


@db
def test_marking_sent_gives_the_frame_once_it_may_go_out(node, cluster):
    command = do_send_command(node, "reboot", params={"reason": "xid:79"})
    other = do_register_node(cluster, "gpu-002")
    assert do_mark_command_sent(other.pk, command.pk) is None  # not that node's
    assert do_mark_command_sent(node.pk, command.pk) == {
        "type": "command", "id": command.pk, "action": "reboot", "params": {"reason": "xid:79"}}
    assert reload(command).status == AgentCommand.Status.SENT and command.sent_at is not None
    assert do_mark_command_sent(node.pk, command.pk) is not None  # unanswered: may go again

    do_record_command_result(node, command_id=command.pk, status="accepted")
    assert do_mark_command_sent(node.pk, command.pk) is None  # the agent has started it


@db
def test_a_command_past_its_deadline_is_not_sent(node):
    now = timezone.now()
    command = do_send_command(node, "reboot", deadline_s=60, now=now)
    assert do_mark_command_sent(node.pk, command.pk, now=now + timedelta(seconds=60)) is None
    assert reload(command).status == AgentCommand.Status.QUEUED


@db
def test_results_move_the_command_and_a_late_one_changes_nothing(node):
    command = do_send_command(node, "reboot")
    do_mark_command_sent(node.pk, command.pk)
    accepted = do_record_command_result(node, command_id=command.pk, status="accepted")
    assert accepted.status == "accepted" and accepted.finished_at is None

    failed = do_record_command_result(node, command_id=command.pk, status="failed",
                                      message="reboot command `systemctl reboot` exited with 1")
    assert failed.status == "failed" and failed.finished_at is not None
    assert failed.message == "reboot command `systemctl reboot` exited with 1"

    for status in ("accepted", "ok"):
        late = do_record_command_result(node, command_id=command.pk, status=status)
        assert late.status == "failed" and late.message == failed.message


@db
def test_a_result_for_no_command_of_this_node_is_none(node, cluster):
    other = do_register_node(cluster, "gpu-002")
    theirs = do_send_command(other, "reboot")
    assert do_record_command_result(node, command_id=theirs.pk, status="ok") is None
    assert do_record_command_result(node, command_id=999999, status="ok") is None
    assert reload(theirs).status == AgentCommand.Status.QUEUED


# After a hello: what goes out again, and the reboot that happened


@db
def test_after_a_hello_with_the_same_boot_id_unanswered_commands_go_out_again(node):
    command = do_send_command(node, "reboot")
    do_mark_command_sent(node.pk, command.pk)
    do_record_hello(node, boot_id="boot-1")  # the connection dropped and came back
    assert command_frames_for(node.pk) == [
        {"type": "command", "id": command.pk, "action": "reboot", "params": {}}]


@db
def test_after_a_hello_an_accepted_reboot_is_not_sent_again(node):
    command = do_send_command(node, "reboot")
    do_mark_command_sent(node.pk, command.pk)
    do_record_command_result(node, command_id=command.pk, status="accepted")
    do_record_hello(node, boot_id="boot-1")
    assert command_frames_for(node.pk) == []
    assert reload(command).status == AgentCommand.Status.ACCEPTED


@db
@pytest.mark.parametrize("answered", ["queued", "sent", "accepted"])
def test_a_node_back_with_a_new_boot_id_is_not_rebooted_again(node, answered):
    command = do_send_command(node, "reboot")
    if answered != "queued":
        do_mark_command_sent(node.pk, command.pk)
    if answered == "accepted":
        do_record_command_result(node, command_id=command.pk, status="accepted")
    do_record_hello(node, boot_id="boot-2")
    assert command_frames_for(node.pk) == []
    assert unfinished_command_ids(node.pk) == []
    assert reload(command).status == AgentCommand.Status.OK
    assert command.message == "the node rebooted" and command.finished_at is not None


@db
def test_a_reboot_asked_after_the_reboot_goes_out(node):
    do_record_hello(node, boot_id="boot-2")
    command = do_send_command(node, "reboot")
    assert command.boot_id_before == "boot-2"
    assert [frame["id"] for frame in command_frames_for(node.pk)] == [command.pk]


# Deadlines


@db
def test_commands_past_their_deadline_time_out_and_say_why(node, cluster):
    now = timezone.now()
    queued = do_send_command(node, "reboot", now=now)
    sent_node = do_register_node(cluster, "gpu-002")
    do_record_hello(sent_node, boot_id="boot-a")
    sent = do_send_command(sent_node, "reboot", now=now)
    do_mark_command_sent(sent_node.pk, sent.pk, now=now)
    accepted_node = do_register_node(cluster, "gpu-003")
    do_record_hello(accepted_node, boot_id="boot-b")
    accepted = do_send_command(accepted_node, "reboot", now=now)
    do_mark_command_sent(accepted_node.pk, accepted.pk, now=now)
    do_record_command_result(accepted_node, command_id=accepted.pk, status="accepted")

    assert expire_commands(now=now + timedelta(minutes=14)) == 0
    deadline = now + timedelta(minutes=15)
    assert expire_commands(now=deadline) == 3
    assert expire_commands(now=deadline) == 0
    assert {command.status for command in map(reload, (queued, sent, accepted))} == {"timed_out"}
    assert queued.message == "not sent in time: the node's agent was not connected"
    assert sent.message == "no answer in time from the node's agent"
    assert accepted.message == "the node did not come back with a new boot id in time"
    assert accepted.finished_at == deadline


@db
def test_a_reboot_whose_node_came_back_is_done_at_its_deadline_not_timed_out(node):
    """The hello was recorded, but no connection looked at the commands after it."""
    now = timezone.now()
    command = do_send_command(node, "reboot", now=now)
    do_mark_command_sent(node.pk, command.pk, now=now)
    Node.objects.filter(pk=node.pk).update(boot_id="boot-2")
    assert expire_commands(now=now + timedelta(minutes=15)) == 0
    assert reload(command).status == AgentCommand.Status.OK


@db
def test_the_beat_task_expires_commands(node):
    command = do_send_command(node, "reboot", deadline_s=1,
                              now=timezone.now() - timedelta(seconds=5))
    assert tasks.expire_commands() == 1
    assert reload(command).status == AgentCommand.Status.TIMED_OUT


# Over the agent WebSocket


async def send_command(name):
    node = await database_sync_to_async(Node.objects.get)(name=name)
    return await database_sync_to_async(do_send_command)(node, "reboot")


async def reloaded(command):
    return await database_sync_to_async(reload)(command)


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_command_reaches_the_connected_agent_and_its_answers_are_kept(join_token):
    communicator, _ = await join(join_token)
    command = await send_command("gpu-001")
    await Publisher().push_changes()  # the change feed offers it to the connection

    assert await receive(communicator) == {
        "type": "command", "id": command.pk, "action": "reboot", "params": {}}
    assert (await reloaded(command)).status == AgentCommand.Status.SENT

    await send(communicator, {"type": "command_result", "id": command.pk, "status": "accepted",
                              "message": ""})
    await send(communicator, {"type": "command_result", "id": 999999, "status": "ok"})
    assert await receive(communicator) == {
        "type": "error", "code": "bad_message",
        "message": "command_result.id: no command 999999 for this node"}
    assert (await reloaded(command)).status == AgentCommand.Status.ACCEPTED
    await communicator.disconnect()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_reboot_goes_out_after_the_hello_again_until_the_node_comes_back_rebooted(
        join_token):
    communicator, welcome = await join(join_token)
    await communicator.disconnect()
    command = await send_command("gpu-001")  # the agent is away: queued

    communicator, _ = await join(welcome["node_token"])
    assert (await receive(communicator))["id"] == command.pk
    await communicator.disconnect()  # dropped before the agent answered

    communicator, _ = await join(welcome["node_token"])  # same boot: sent again
    assert (await receive(communicator))["id"] == command.pk
    await communicator.disconnect()  # the node went down to reboot

    communicator, _ = await join(welcome["node_token"], boot_id="boot-2")
    assert await communicator.receive_nothing(timeout=0.3)  # not rebooted a second time
    command = await reloaded(command)
    assert (command.status, command.message) == ("ok", "the node rebooted")
    await communicator.disconnect()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_command_asked_anywhere_reaches_the_agent_through_the_change_feed(join_token):
    """As from a Celery worker: the service only writes; the publisher, reading the change
    feed, offers the command to the connection once."""
    communicator, _ = await join(join_token)
    node = await database_sync_to_async(Node.objects.get)(name="gpu-001")
    command = await database_sync_to_async(do_send_command)(node, "reboot")
    assert await communicator.receive_nothing(timeout=0.3)  # no publisher has read it yet

    publisher = Publisher()
    await publisher.push_changes()
    frame = await receive(communicator)
    assert (frame["type"], frame["id"], frame["action"]) == ("command", command.pk, "reboot")
    await publisher.push_changes()  # read once, sent once
    assert await communicator.receive_nothing(timeout=0.3)
    await communicator.disconnect()
