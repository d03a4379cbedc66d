"""The client's side of node hygiene, against a real WebSocket server on 127.0.0.1: the
samples carry `hygiene` in the first sample of a connection, when it changes and every
minute; a command handler's message is its `ok`; an event the Epilog hook spooled goes out
through the outbox."""

import asyncio

from agent.connection import client as client_module
from agent.connection.protocol import event_frame
from agent.tests.fake_server import FakeServer, until
from agent.tests.test_client import make_client, running
from agent.work.commands import CommandFailed, CommandSet
from agent.work.scripts import ResultSpool

PROCESSES = {"zombies": 0, "orphans": 0, "tasks": 300, "pid_max": 32768, "checked_at": 1.0}


class Readings:
    """A hygiene status() the test changes."""

    def __init__(self):
        self.value = {"processes": dict(PROCESSES)}

    def __call__(self):
        return self.value


def hygiene_of(connection):
    return [sample["hygiene"] for sample in connection.of_type("sample") if "hygiene" in sample]


def test_samples_carry_hygiene_first_on_each_connection_then_when_it_changes(tmp_path):
    readings = Readings()

    async def scenario():
        async with FakeServer() as server, running(make_client(
                server, tmp_path, hygiene_status=readings)):
            await until(lambda: server.connections
                        and len(server.connections[0].of_type("sample")) >= 5)
            readings.value = {"processes": {**PROCESSES, "checked_at": 2.0}}  # a time only
            await until(lambda: len(server.connections[0].of_type("sample")) >= 10)
            readings.value = {"processes": {**PROCESSES, "zombies": 12, "checked_at": 3.0}}
            await until(lambda: len(hygiene_of(server.connections[0])) >= 2)
            await server.connections[0].ws.close(1001, "server restart")
            await until(lambda: len(server.connections) == 2
                        and len(server.connections[1].of_type("sample")) >= 3)
            return server.connections

    first, second = asyncio.run(scenario())
    assert first.of_type("sample")[0]["hygiene"] == {"processes": PROCESSES}
    assert hygiene_of(first) == [{"processes": PROCESSES},
                                 {"processes": {**PROCESSES, "zombies": 12, "checked_at": 3.0}}]
    assert second.of_type("sample")[0]["hygiene"]["processes"]["zombies"] == 12
    assert len(hygiene_of(second)) == 1


def test_unchanged_hygiene_is_sent_again_after_a_minute(tmp_path, monkeypatch):
    monkeypatch.setattr(client_module, "HYGIENE_RESEND_S", 0.2)
    readings = Readings()

    async def scenario():
        async with FakeServer() as server, running(make_client(
                server, tmp_path, hygiene_status=readings)):
            await until(lambda: server.connections and len(hygiene_of(server.connections[0])) >= 3)
            return server.connections[0]

    connection = asyncio.run(scenario())
    samples = connection.of_type("sample")
    assert len(samples) > len(hygiene_of(connection))  # not in every sample


class Cleanup:
    actions = ("cleanup", "reconfigure")

    async def run(self, action, params, client):
        if action == "reconfigure":
            raise CommandFailed("scontrol update failed: Invalid generic resource")
        return "ended 2 orphaned processes; 0 zombies left"


def test_a_handlers_message_is_its_ok_and_a_failure_its_failed(tmp_path):
    async def scenario():
        async with FakeServer() as server:
            server.after_welcome = [
                {"type": "command", "id": 5, "action": "cleanup", "params": {}},
                {"type": "command", "id": 6, "action": "reconfigure", "params": {}},
            ]
            async with running(make_client(server, tmp_path,
                                           command_handler=CommandSet([Cleanup()]))):
                await until(lambda: server.connections
                            and len(server.connections[0].of_type("command_result")) >= 4)
            return server.connections[0]

    connection = asyncio.run(scenario())
    answers = {(frame["id"], frame["status"]): frame["message"]
               for frame in connection.of_type("command_result")}
    assert answers == {
        (5, "accepted"): "", (5, "ok"): "ended 2 orphaned processes; 0 zombies left",
        (6, "accepted"): "", (6, "failed"): "scontrol update failed: Invalid generic resource"}


def test_an_event_the_hook_spooled_goes_out_through_the_outbox(tmp_path):
    notice = event_frame(signature="job_cleanup", severity="info",
                         message="job 7 (alice): 1 process found by /proc, 1 ended",
                         detail={"job_id": "7"})
    ResultSpool(str(tmp_path)).add(notice)

    async def scenario():
        async with FakeServer() as server, running(make_client(server, tmp_path)) as client:
            await until(lambda: server.connections
                        and server.connections[0].of_type("event"))
            return server.connections[0], client

    connection, client = asyncio.run(scenario())
    assert [event["id"] for event in connection.of_type("event")] == [notice["id"]]
    assert ResultSpool(str(tmp_path)).pending() == []
