"""Hostile and broken frames on the agent WebSocket against the database (PROTOCOL.md,
Limits): each is answered, none drops the connection, a normal event after it is acked, and
what the protocol allows fits the columns that store it."""

import json
import uuid

import pytest
from channels.db import database_sync_to_async

from healthchecks.models import HealthEvent
from nodes.models import Gpu, Node
from nodes.services import do_issue_node_token
from gateway.tests.test_consumers import event, hello, join, receive, send
from startup.models import ScriptRun

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("in_memory_channel_layer")]


def raw_event(**fields):
    """An event's JSON text, with `fields` put in as raw JSON (1e400 has no Python value)."""
    frame = event()
    for name in fields:
        frame[name] = f"@{name}@"
    text = json.dumps(frame)
    for name, raw in fields.items():
        text = text.replace(json.dumps(f"@{name}@"), raw)
    return frame["id"], text


async def assert_still_served(agent):
    normal = event(signature="thermal_throttle")
    await send(agent, normal)
    assert await receive(agent) == {"type": "ack", "ids": [normal["id"]]}


HOSTILE_EVENTS = {
    "an Xid with non-ASCII digits": {"signature": json.dumps("xid:\u0667\u0669")},
    "a NUL in the message": {"message": json.dumps("GPU\u0000 fell off")},
    "a lone surrogate in the message": {"message": '"GPU \\ud800 fell off"'},
    "a NUL in a detail key": {"detail": json.dumps({"a\u0000": 1})},
    "a timestamp past a double": {"ts": "1e400"},
    "a count past 32 bits": {"count": str(2 ** 31)},
    "a detail over 16 KiB": {"detail": json.dumps({f"k{i}": "v" * 900 for i in range(20)})},
    "a GPU uuid over 80 characters": {"gpu_uuid": json.dumps("G" * 81)},
}


@pytest.mark.parametrize("fields", HOSTILE_EVENTS.values(), ids=HOSTILE_EVENTS.keys())
async def test_a_hostile_event_is_answered_with_its_id_and_the_node_stays_served(join_token,
                                                                                 fields):
    agent, _ = await join(join_token)
    event_id, text = raw_event(**fields)
    await agent.send_to(text_data=text)
    answer = await receive(agent)
    assert answer["type"] == "error" and answer["code"] == "bad_message"
    assert answer["id"] == event_id  # the agent drops it: it can never be accepted
    await assert_still_served(agent)
    signatures = await database_sync_to_async(list)(
        HealthEvent.objects.values_list("signature", flat=True))
    assert signatures == ["thermal_throttle"]
    await agent.disconnect()


async def test_free_text_over_its_limit_is_stored_cut(join_token):
    agent, _ = await join(join_token)
    long = event(message="m" * 5000, detail={"line": "k" * 5000})
    await send(agent, long)
    assert await receive(agent) == {"type": "ack", "ids": [long["id"]]}
    stored = await database_sync_to_async(HealthEvent.objects.get)()
    assert stored.message == "m" * 999 + "…"
    assert stored.evidence["line"] == "k" * 999 + "…"
    await agent.disconnect()


async def test_counts_add_up_past_32_bits(join_token):
    agent, _ = await join(join_token)
    for _ in range(3):
        storm = event(signature="hw_slowdown", count=2 ** 31 - 1)
        await send(agent, storm)
        assert await receive(agent) == {"type": "ack", "ids": [storm["id"]]}
    stored = await database_sync_to_async(HealthEvent.objects.get)()
    assert stored.count == 3 * (2 ** 31 - 1)
    await agent.disconnect()


async def test_the_largest_hello_the_protocol_allows_is_stored(join_token):
    gpus = [{"index": 1023, "uuid": "G" * 80, "name": "N" * 96, "pci_bus_id": "0" * 32,
             "memory_total_bytes": 2 ** 63 - 1}]
    agent, _ = await join(join_token, node="n" * 63, boot_id="b" * 64, gpus=gpus)
    gpu = await database_sync_to_async(Gpu.objects.get)()
    assert (gpu.index, gpu.uuid, gpu.name, gpu.memory_total_bytes) == (
        1023, "G" * 80, "N" * 96, 2 ** 63 - 1)
    node = await database_sync_to_async(Node.objects.get)()
    assert node.name == "n" * 63 and node.boot_id == "b" * 64
    await agent.disconnect()


async def test_results_naming_ids_no_row_can_have_are_answered_not_failed(join_token):
    agent, _ = await join(join_token)
    huge = 2 ** 63 - 1
    await send(agent, {"type": "check_result", "run_id": huge, "status": "passed"})
    answer = await receive(agent)
    assert answer["code"] == "bad_message" and "no run" in answer["message"]
    await send(agent, {"type": "command_result", "id": -huge, "status": "ok"})
    answer = await receive(agent)
    assert answer["code"] == "bad_message" and "no command" in answer["message"]
    await send(agent, {"type": "script_result", "script_id": huge, "version": -huge,
                       "event": "job_end", "job_id": "9" * 64, "exit_code": -2 ** 40,
                       "duration_s": 1e308, "output_tail": "x" * 10_000})
    await assert_still_served(agent)  # no error came before the ack
    run = await database_sync_to_async(ScriptRun.objects.get)()
    assert (run.version_number, run.exit_code, len(run.output_tail)) == (-huge, -2 ** 40, 4096)
    await agent.disconnect()


async def test_a_hello_that_breaks_a_limit_is_answered_and_may_be_said_again(join_token):
    agent, _ = await join(join_token)
    await send(agent, hello(boot_id="b" * 65))
    answer = await receive(agent)
    assert answer["code"] == "bad_message" and answer["message"].startswith("hello.boot_id: ")
    await send(agent, hello(boot_id="boot-2"))
    assert (await receive(agent))["type"] == "welcome"
    assert (await receive(agent))["type"] == "config"
    await assert_still_served(agent)
    await agent.disconnect()


async def test_an_event_id_of_another_form_is_refused_without_an_id(join_token):
    agent, _ = await join(join_token)
    await send(agent, event(id="{" + str(uuid.uuid4()) + "}"))
    answer = await receive(agent)
    assert answer["code"] == "bad_message" and "id" not in answer
    await assert_still_served(agent)
    await agent.disconnect()


async def test_events_the_agents_full_outbox_dropped_are_on_the_nodes_health(join_token):
    agent, _ = await join(join_token, boot_id="boot-1")
    await agent.disconnect()
    again = await connect_agent(join_token, outbox_dropped=5)
    stored = await database_sync_to_async(HealthEvent.objects.get)(signature="agent_outbox_full")
    assert (stored.severity, stored.count) == ("info", 5)
    assert "dropped 5 unsent events" in stored.message
    await again.disconnect()


async def connect_agent(join_token, **hello_fields):
    """A hello with a node token (the node exists), welcomed."""
    token = await database_sync_to_async(do_issue_node_token)(
        await database_sync_to_async(Node.objects.get)())
    agent, _ = await join(token[1], **hello_fields)
    return agent
