"""The client against a real WebSocket server on 127.0.0.1 (fake_server.FakeServer)."""

import asyncio
import contextlib
import os
import random
import stat
from types import SimpleNamespace

import pytest

from agent.config import Config, parse_inject
from agent.connection.client import AgentClient, backoff_ceiling, backoff_delay
from agent.connection.node_token import read_node_token, save_node_token
from agent.connection.outbox import Outbox
from agent.connection.protocol import event_frame
from agent.node import Node
from agent.node_metrics import NodeMetrics
from agent.sim.backend import SimulatedBackend
from agent.sim.node import simulated_watchers
from agent.tests.fake_server import FakeServer, until
from agent.tests.protocol_validator import SAMPLE_GPU_FIELDS, SAMPLE_NODE_FIELDS

NODE = "gpu-001"
NODE_OPTIONS = ("check_runner", "command_handler", "hygiene_status", "read_slurm")


def make_client(server, state_dir, *, join_token="join-1", inject="", **options):
    """A client of `server` on 2 simulated GPUs, sampling every 0.05 s, reconnecting
    after at most 0.05 s. options: the Node's (check_runner, command_handler,
    hygiene_status, read_slurm), the config's sample_interval_s, the client's others."""
    faults = parse_inject(inject) if inject else ()
    settings = dict(sample_interval_s=0.05, backoff_base_s=0.01, backoff_cap_s=0.05)
    outbox_max_bytes = options.pop("outbox_max_bytes", 64 * 2**20)
    settings.update(options)
    backend = SimulatedBackend(NODE, gpu_count=2, faults=faults)
    config = Config(server=server.url, token=join_token, node_name=NODE,
                    state_dir=str(state_dir), sample_interval_s=settings.pop("sample_interval_s"))
    node = Node(
        name=NODE,
        boot_id="b7e3a0c2-4f1d-4c1e-9a8b-2d6f5e4c3b2a",
        backend=backend,
        watchers=simulated_watchers(Config(node_name=NODE), backend),
        node_metrics=NodeMetrics(),
        **{key: settings.pop(key) for key in NODE_OPTIONS if key in settings},
    )
    return AgentClient(
        config,
        node,
        node_token=read_node_token(state_dir),
        outbox=Outbox(state_dir / "outbox.sqlite3", max_bytes=outbox_max_bytes),
        **settings,
    )


@contextlib.asynccontextmanager
async def running(client):
    task = asyncio.create_task(client.run())
    try:
        yield client
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        client._outbox.close()


def test_join_token_first_then_the_stored_node_token(tmp_path):
    async def scenario():
        async with FakeServer() as server, running(make_client(server, tmp_path)):
            await until(
                lambda: len(server.connections) == 1
                and len(server.connections[0].of_type("sample")) >= 3
            )
            await server.connections[0].ws.close(1001, "server restart")
            await until(
                lambda: len(server.connections) == 2
                and len(server.connections[1].of_type("sample")) >= 3
            )
            return server.connections

    first, second = asyncio.run(scenario())

    assert first.authorization == "Bearer join-1"
    assert second.authorization == "Bearer node-token-1"
    token_file = tmp_path / "node_token"
    assert token_file.read_text() == "node-token-1\n"
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
    for connection in (first, second):
        assert connection.frames[0]["type"] == "hello"
        assert connection.frames[0]["node"] == NODE
        assert len(connection.of_type("hello")) == 1
        seqs = [frame["seq"] for frame in connection.of_type("sample")]
        assert seqs == list(range(len(seqs)))  # from 0 on every connection, one by one


def test_a_stored_node_token_wins_over_the_join_token(tmp_path):
    async def scenario():
        async with FakeServer() as server:
            server.node_tokens.add("node-token-kept")
            async with running(make_client(server, tmp_path)):
                await until(lambda: server.connections and server.connections[0].welcomed)
            return server.connections

    save_node_token(str(tmp_path), "node-token-kept")
    [connection] = asyncio.run(scenario())

    assert connection.authorization == "Bearer node-token-kept"


def test_a_stopping_agent_closes_with_going_away(tmp_path):
    async def scenario():
        async with FakeServer() as server:
            async with running(make_client(server, tmp_path)):
                await until(lambda: server.connections and server.connections[0].welcomed)
            await until(lambda: server.connections[0].close_code is not None)
            return server.connections[0]

    assert asyncio.run(scenario()).close_code == 1001


def test_events_are_resent_after_a_reconnect_until_acked(tmp_path):
    async def scenario():
        async with FakeServer() as server:
            server.ack_events = False
            client = make_client(server, tmp_path, inject="xid:79@0s:gpu1")
            async with running(client):
                await until(lambda: server.connections and server.connections[0].of_type("event"))
                await server.connections[0].ws.close(1001)
                await until(
                    lambda: len(server.connections) == 2 and server.connections[1].of_type("event")
                )
                server.ack_events = True
                await server.connections[1].ws.close(1001)
                await until(
                    lambda: len(server.connections) == 3 and server.connections[2].of_type("event")
                )
                await until(lambda: len(client._outbox) == 0)
                await server.connections[2].ws.close(1001)
                await until(
                    lambda: len(server.connections) == 4
                    and len(server.connections[3].of_type("sample")) >= 3
                )
            return server.connections, client

    connections, client = asyncio.run(scenario())

    [event] = connections[0].of_type("event")
    assert event["signature"] == "xid:79"
    assert event["gpu_uuid"] == client._backend.gpus()[1]["uuid"]
    for connection in connections[1:3]:
        assert connection.frames[0]["type"] == "hello"
        assert connection.of_type("event") == [event]  # the same id, resent
    assert connections[3].of_type("event") == []  # acked on the third: not sent again


def test_unacked_events_survive_an_agent_restart(tmp_path):
    async def scenario():
        async with FakeServer() as server:
            server.ack_events = False
            async with running(make_client(server, tmp_path, inject="xid:48@0s,gpu_lost@0s:gpu1")):
                await until(
                    lambda: server.connections and len(server.connections[0].of_type("event")) == 2
                )
            server.ack_events = True
            # A new agent process: new client, new backend (no faults), same state dir.
            restarted = make_client(server, tmp_path)
            async with running(restarted):
                await until(
                    lambda: len(server.connections) == 2
                    and len(server.connections[1].of_type("event")) == 2
                )
                await until(lambda: len(restarted._outbox) == 0)
            return server.connections

    before, after = asyncio.run(scenario())

    # The backend's own events (gpu_lost) come before the watchers' (the Xid).
    assert [e["signature"] for e in before.of_type("event")] == ["gpu_lost", "xid:48"]
    assert after.of_type("event") == before.of_type("event")  # same ids, same order
    assert len(Outbox(tmp_path / "outbox.sqlite3").pending()) == 0


def test_an_error_naming_an_event_drops_it_from_the_outbox(tmp_path, caplog):
    async def scenario():
        async with FakeServer() as server:
            server.refuse_events = True
            client = make_client(server, tmp_path, inject="xid:79@0s")
            async with running(client):
                await until(lambda: server.connections and server.connections[0].of_type("event"))
                await until(lambda: len(client._outbox) == 0)
                await server.connections[0].ws.close(1001)
                await until(
                    lambda: len(server.connections) == 2
                    and len(server.connections[1].of_type("sample")) >= 3
                )
            return server.connections

    first, second = asyncio.run(scenario())

    assert second.of_type("event") == []
    assert "the server refused event" in caplog.text


@pytest.mark.parametrize("refuse_with", ["close", "http"])
def test_a_refused_node_token_falls_back_to_the_join_token(tmp_path, caplog, refuse_with):
    async def scenario():
        async with FakeServer() as server:
            server.refuse_with = refuse_with
            async with running(make_client(server, tmp_path)):
                # The server has sent the welcome, and the agent has taken it in.
                await until(lambda: any(c.welcomed for c in server.connections)
                            and read_node_token(str(tmp_path)) != "revoked-node-token")
            return server

    save_node_token(str(tmp_path), "revoked-node-token")
    server = asyncio.run(scenario())

    assert server.attempts[:2] == ["Bearer revoked-node-token", "Bearer join-1"]
    assert read_node_token(str(tmp_path)) == "node-token-1"
    assert "refused the stored node token" in caplog.text


@pytest.mark.parametrize("refuse_with", ["close", "http"])
def test_a_refused_join_token_is_retried_with_backoff(tmp_path, caplog, refuse_with):
    async def scenario():
        async with FakeServer() as server:
            server.refuse_with = refuse_with
            async with running(make_client(server, tmp_path, join_token="expired")):
                await until(lambda: len(server.attempts) >= 3)
            return server

    server = asyncio.run(scenario())

    assert set(server.attempts) == {"Bearer expired"}
    assert "refused the join token" in caplog.text
    assert read_node_token(str(tmp_path)) is None


def test_a_connection_replaced_by_a_newer_one_reconnects(tmp_path, caplog):
    async def scenario():
        async with FakeServer() as server:

            async def replace_first(connection):
                if len(server.connections) == 1:
                    await connection.ws.close(4409, "replaced")

            server.on_welcome = replace_first
            async with running(make_client(server, tmp_path)):
                await until(
                    lambda: len(server.connections) == 2 and server.connections[1].of_type("sample")
                )

    asyncio.run(scenario())

    assert "replaced by a newer connection for node gpu-001" in caplog.text


def test_commands_and_checks_are_answered_as_not_supported_without_a_check_runner(tmp_path, caplog):
    async def scenario():
        async with FakeServer() as server:
            server.after_welcome = [
                {"type": "command", "id": 91, "action": "reboot", "params": {}},
                {
                    "type": "run_check",
                    "run_id": 57,
                    "check": "gpu_compute",
                    "params": {"seconds": 10},
                },
                {"type": "from_the_future", "x": 1},
                "not json",
            ]
            async with running(make_client(server, tmp_path)):
                await until(
                    lambda: server.connections and len(server.connections[0].of_type("sample")) >= 3
                )
            return server.connections

    [connection] = asyncio.run(scenario())

    assert connection.of_type("command_result") == [
        {
            "type": "command_result",
            "id": 91,
            "status": "failed",
            "message": "action reboot is not supported by this agent version",
        }
    ]
    [check_result] = connection.of_type("check_result")
    assert check_result["run_id"] == 57
    assert check_result["status"] == "error"
    assert check_result["message"] == "check gpu_compute is not available: this agent runs no checks"
    assert "ignoring a frame of unknown type 'from_the_future'" in caplog.text
    assert "ignoring a frame that is not JSON" in caplog.text


def test_the_servers_sample_interval_and_startup_scripts_are_taken(tmp_path):
    scripts = [
        {
            "id": 3,
            "version": 7,
            "event": "job_start",
            "role": "worker",
            "timeout_s": 300,
            "body": "#!/bin/bash\ntrue\n",
        }
    ]

    async def scenario():
        async with FakeServer() as server:
            server.welcome_interval_s = 0.05
            server.startup_scripts = scripts
            client = make_client(server, tmp_path, sample_interval_s=2.0)
            async with running(client):
                # At the agent's own 2 s, five samples would take 8 s.
                await until(
                    lambda: server.connections
                    and len(server.connections[0].of_type("sample")) >= 5,
                    timeout_s=2,
                )
            return client

    client = asyncio.run(scenario())

    assert client.sample_interval_s == 0.05
    assert client.startup_scripts == scripts


def test_samples_carry_every_gpu_and_node_field(tmp_path):
    async def scenario():
        async with FakeServer() as server:
            async with running(make_client(server, tmp_path)):
                await until(
                    lambda: server.connections and len(server.connections[0].of_type("sample")) >= 2
                )
            return server.connections[0]

    connection = asyncio.run(scenario())

    sample = connection.of_type("sample")[1]
    hello = connection.frames[0]
    assert [gpu["uuid"] for gpu in sample["gpus"]] == [gpu["uuid"] for gpu in hello["gpus"]]
    assert set(sample["node"]) == SAMPLE_NODE_FIELDS
    assert set(sample["gpus"][0]) == SAMPLE_GPU_FIELDS


def test_events_found_while_disconnected_wait_in_the_outbox(tmp_path):
    async def scenario():
        async with FakeServer() as server:
            pass  # started and stopped: nothing listens at its address any more
        client = make_client(server, tmp_path, inject="xid:79@0s")
        async with running(client):
            await until(lambda: len(client._outbox) == 1)
            await asyncio.sleep(0.1)  # a few failed connects

    asyncio.run(scenario())

    [event] = Outbox(tmp_path / "outbox.sqlite3").pending()
    assert event["signature"] == "xid:79"


class RecordingRng:
    """Stands in for `random`: records each ceiling and waits the longest."""

    def __init__(self):
        self.ceilings = []

    def uniform(self, low, high):
        self.ceilings.append(high)
        return high


def test_backoff_resets_after_a_connection_that_lasted(tmp_path):
    rng = RecordingRng()

    async def scenario():
        async with FakeServer() as server:

            async def close_soon(connection):
                # Connections 1-4 end at once; the 5th lasts 0.3 s (stable at 0.2 s).
                await asyncio.sleep(0.3 if len(server.connections) == 5 else 0)
                await connection.ws.close(1001)

            server.on_welcome = close_soon
            client = make_client(
                server,
                tmp_path,
                backoff_base_s=0.01,
                backoff_cap_s=1.0,
                stable_connection_s=0.2,
                rng=rng,
            )
            async with running(client):
                await until(lambda: len(rng.ceilings) >= 5)

    asyncio.run(scenario())

    assert rng.ceilings[:5] == [0.01, 0.02, 0.04, 0.08, 0.01]


def test_backoff_grows_from_1_s_and_is_capped_at_30_s():
    assert [backoff_ceiling(attempt) for attempt in range(8)] == [1, 2, 4, 8, 16, 30, 30, 30]
    assert backoff_ceiling(10_000) == 30


def test_backoff_has_full_jitter():
    rng = random.Random(7)
    delays = [backoff_delay(5, rng) for _ in range(1000)]

    assert all(0 <= delay <= 30 for delay in delays)
    assert min(delays) < 3 and max(delays) > 27  # spread over the whole range


def test_the_first_backoff_is_at_most_about_a_second():
    rng = random.Random(7)
    assert all(0 <= backoff_delay(0, rng) <= 1.0 for _ in range(100))


def test_an_event_too_large_to_send_is_not_kept(tmp_path, caplog):
    client = make_client(SimpleNamespace(url="ws://127.0.0.1:9/ws/agent/"), tmp_path)
    huge = event_frame(
        signature="xid:79", severity="critical", message="m", detail={"blob": ["x" * 900] * 1200}
    )

    asyncio.run(client.emit(huge))

    assert len(client._outbox) == 0
    assert "cannot be sent, dropped" in caplog.text
    client._outbox.close()


def test_a_hello_the_server_could_not_take_is_said_again_on_the_same_connection(tmp_path):
    """server_error or rate_limited before welcome (the server's database is away, it has
    many hellos in hand): the agent says hello again after retry_after_s instead of waiting
    out the welcome timeout."""
    async def scenario():
        async with FakeServer() as server:
            server.hello_errors = ["server_error", "rate_limited"]
            server.retry_after_s = 0.2
            client = make_client(server, tmp_path)
            async with running(client):
                await until(lambda: server.connections and server.connections[0].welcomed)
                return server.connections

    connections = asyncio.run(scenario())

    assert len(connections) == 1
    assert len(connections[0].of_type("hello")) == 3


def test_an_event_the_server_could_not_store_is_sent_again_after_retry_after_s(tmp_path):
    """`error` with retry_id (PROTOCOL.md: server_error, rate_limited): the event stays in
    the outbox and goes again on the same connection once retry_after_s has passed."""
    async def scenario():
        async with FakeServer() as server:
            server.server_errors, server.retry_after_s = 2, 0.2
            client = make_client(server, tmp_path, inject="xid:79@0s")
            async with running(client):
                await until(lambda: len(client._outbox) == 0 and server.connections
                            and len(server.connections[0].of_type("event")) >= 3)
                connection = server.connections[0]
                assert len(server.connections) == 1  # no reconnect was needed
                return [frame["id"] for frame in connection.of_type("event")]

    sent = asyncio.run(scenario())

    assert len(sent) == 3 and len(set(sent)) == 1  # refused twice, acked the third time


def test_the_hello_tells_the_server_what_a_full_outbox_dropped_then_the_count_restarts(
        tmp_path):
    outbox = Outbox(tmp_path / "outbox.sqlite3", max_bytes=600)
    for _ in range(4):  # about 300 bytes each: two are dropped
        outbox.add(event_frame(signature="xid:79", severity="info", message="m" * 50))
    dropped = outbox.dropped()
    assert dropped == 2
    outbox.close()

    async def scenario():
        async with FakeServer() as server:
            server.ack_events = False
            async with running(make_client(server, tmp_path,
                                           outbox_max_bytes=600)) as client:
                await until(lambda: server.connections and server.connections[0].welcomed)
                # The count restarts once the agent has read the welcome, which the fake
                # server marks as it sends it: wait for the agent's side (a race before).
                await until(lambda: client._outbox.dropped() == 0)
                await server.connections[0].ws.close(1001, "server restart")
                await until(lambda: len(server.connections) == 2
                            and server.connections[1].welcomed)
                return server.connections

    first, second = asyncio.run(scenario())
    assert first.of_type("hello")[0]["outbox_dropped"] == 2
    assert "outbox_dropped" not in second.of_type("hello")[0]


def test_after_a_reconnect_the_outbox_goes_out_paced_and_all_of_it(tmp_path, monkeypatch):
    monkeypatch.setattr("agent.connection.client.RESEND_BURST", 5)
    monkeypatch.setattr("agent.connection.client.RESEND_PER_S", 200.0)
    outbox = Outbox(tmp_path / "outbox.sqlite3")
    events = [event_frame(signature="xid:79", severity="critical", message=str(i))
              for i in range(30)]
    for event in events:
        outbox.add(event)
    outbox.close()

    async def scenario():
        async with FakeServer() as server:
            async with running(make_client(server, tmp_path)):
                await until(lambda: server.connections
                            and len(server.connections[0].of_type("event")) == 30)
                return server.connections[0]

    connection = asyncio.run(scenario())
    assert [e["id"] for e in connection.of_type("event")] == [e["id"] for e in events]
    # It answered the server meanwhile: samples went out while the outbox was resent.
    frames = [f["type"] for f in connection.frames]
    first, last = frames.index("event"), len(frames) - 1 - frames[::-1].index("event")
    assert "sample" in frames[first:last]
