"""What the agent WebSocket does when the server itself fails (PostgreSQL away, a bug) or has
more hellos in hand than it can soon answer: every frame is answered (`server_error`,
`rate_limited`) and the connection stays (PROTOCOL.md), so the agent says it again; a token
that could not be checked at connect is checked at the hello; a work offer that fails is
tried again."""

import asyncio
import threading

import pytest
from channels.db import database_sync_to_async
from django.db import OperationalError

from gateway import consumers, ingest, reconnects
from nodes.models import AgentCommand, Node
from gateway.publisher import Publisher
from nodes.services import do_send_command
from gateway.tests.test_consumers import closed_with, connect, hello, join, receive, send

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("in_memory_channel_layer")]


def failing(times, original, error=OperationalError("connection refused")):
    """`original`, raising `error` the first `times` calls."""
    calls = []

    def call(*args, **kwargs):
        calls.append(args)
        if len(calls) <= times:
            raise error
        return original(*args, **kwargs)

    call.calls = calls
    return call


async def test_a_hello_that_fails_is_answered_server_error_and_may_be_said_again(
        join_token, monkeypatch):
    monkeypatch.setattr(ingest, "accept_hello", failing(1, ingest.accept_hello))
    agent = await connect(join_token)
    await send(agent, hello())
    assert await receive(agent) == {"type": "error", "code": "server_error",
                                    "message": "the hello was not handled; send it again later"}

    await send(agent, hello())  # the same connection
    assert (await receive(agent))["type"] == "welcome"
    assert await database_sync_to_async(Node.objects.filter(name="gpu-001").exists)()
    await agent.disconnect()


@pytest.mark.parametrize("error", [OperationalError("connection refused"),
                                   KeyError("a bug")])
async def test_any_frame_that_fails_is_answered_and_the_connection_stays(
        join_token, monkeypatch, error):
    agent, _ = await join(join_token)
    monkeypatch.setattr(ingest, "record_script_result",
                        failing(1, ingest.record_script_result, error))
    result = {"type": "script_result", "script_id": 1, "event": "node_boot", "exit_code": 0,
              "duration_s": 1.0}
    await send(agent, result)
    error_frame = await receive(agent)
    assert error_frame == {"type": "error", "code": "server_error",
                           "message": "the script_result was not handled; send it again later"}
    assert "retry_id" not in error_frame and "id" not in error_frame

    await send(agent, {"type": "sample", "seq": 1, "ts": 1764442000.0, "gpus": []})
    assert await agent.receive_nothing(timeout=0.3)  # still open, and still reading
    await agent.disconnect()


async def test_a_token_the_database_could_not_check_at_connect_is_checked_at_the_hello(
        join_token, monkeypatch):
    monkeypatch.setattr(reconnects, "authenticate", failing(1, reconnects.authenticate))
    agent = await connect(join_token)  # accepted: the database was away
    await send(agent, hello())
    assert (await receive(agent))["type"] == "welcome"
    assert len(reconnects.authenticate.calls) == 2
    await agent.disconnect()


async def test_a_bad_token_not_checked_at_connect_is_closed_4401_at_the_hello(monkeypatch):
    monkeypatch.setattr(reconnects, "authenticate", failing(1, reconnects.authenticate))
    agent = await connect("cuj_unknown")
    await send(agent, hello())
    assert await closed_with(agent) == 4401


async def test_a_work_offer_that_fails_is_tried_again_until_it_goes_out(join_token,
                                                                        monkeypatch):
    agent, _ = await join(join_token)
    node = await database_sync_to_async(Node.objects.get)(name="gpu-001")
    monkeypatch.setattr(ingest, "work_frames", failing(2, ingest.work_frames))
    command = await database_sync_to_async(do_send_command)(node, "reboot")
    await Publisher().push_changes()

    frame = await receive(agent)
    assert (frame["type"], frame["id"]) == ("command", command.pk)
    assert len(ingest.work_frames.calls) == 3
    command = await database_sync_to_async(AgentCommand.objects.get)(pk=command.pk)
    assert command.status == AgentCommand.Status.SENT
    await agent.disconnect()


async def test_past_the_hellos_in_hand_a_hello_is_answered_rate_limited_at_once(
        join_token, monkeypatch):
    monkeypatch.setattr(consumers, "HELLOS", consumers.HelloAdmission(limit=1,
                                                                      seconds_of_work=4.0))
    release = threading.Event()
    original = ingest.accept_hello

    def slow_hello(grant, frame, now=None):
        release.wait(5)
        return original(grant, frame, now)

    monkeypatch.setattr(ingest, "accept_hello", slow_hello)
    first, second = await connect(join_token), await connect(join_token)
    await send(first, hello("gpu-001"))
    await asyncio.sleep(0.2)  # in hand now
    await send(second, hello("gpu-002"))
    refused = await receive(second)
    assert (refused["type"], refused["code"]) == ("error", "rate_limited")
    assert 2.0 <= refused["retry_after_s"] <= 6.0

    release.set()
    assert (await receive(first))["type"] == "welcome"
    assert (await receive(first))["type"] == "config"  # the first hello is over
    await send(second, hello("gpu-002"))  # the same connection, once the agent has waited
    assert (await receive(second))["type"] == "welcome"
    assert (await receive(second))["type"] == "config"
    async with asyncio.timeout(2):
        while consumers.HELLOS.in_hand:  # both hellos are over and out of hand
            await asyncio.sleep(0.01)
    await first.disconnect()
    await second.disconnect()
