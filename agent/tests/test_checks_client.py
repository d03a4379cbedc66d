"""Checks through the agent's client and a real WebSocket server on 127.0.0.1
(fake_server.FakeServer): a run_check is answered with its check_result, and a result
that finished while the connection was down goes out after the next welcome."""

import asyncio
import contextlib

from agent.checks.runner import CheckRunner
from agent.config import Config
from agent.connection.client import AgentClient
from agent.connection.node_token import read_node_token
from agent.connection.outbox import Outbox
from agent.node import Node
from agent.node_metrics import NodeMetrics
from agent.sim.backend import SimulatedBackend
from agent.sim.checks import SimulatedCheckRunner
from agent.tests.fake_server import FakeServer, until

NODE = "gpu-001"


def make_client(server, state_dir, backend, check_runner):
    config = Config(server=server.url, token="join-1", node_name=NODE,
                    state_dir=str(state_dir), sample_interval_s=0.05)
    node = Node(name=NODE, boot_id="b7e3a0c2-4f1d-4c1e-9a8b-2d6f5e4c3b2a", backend=backend,
                node_metrics=NodeMetrics(), check_runner=check_runner)
    return AgentClient(
        config,
        node,
        node_token=read_node_token(state_dir),
        outbox=Outbox(state_dir / "outbox.sqlite3"),
        backoff_base_s=0.01,
        backoff_cap_s=0.05,
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


def check_results(server):
    return [
        (number, frame)
        for number, connection in enumerate(server.connections)
        for frame in connection.of_type("check_result")
    ]


def test_a_run_check_is_answered_with_the_real_runners_check_result(tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    backend = SimulatedBackend(NODE, gpu_count=2)

    async def scenario():
        async with FakeServer() as server:
            server.after_welcome = [
                {
                    "type": "run_check",
                    "run_id": 57,
                    "check": "storage",
                    "params": {"bytes": 2**20, "min_write_mbps": 0.001},
                },
                {"type": "run_check", "run_id": 58, "check": "x", "params": {}},
            ]
            client = make_client(server, tmp_path, backend, CheckRunner(backend, scratch))
            async with running(client):
                await until(lambda: len(check_results(server)) == 2, timeout_s=20)
            return server

    server = asyncio.run(scenario())

    by_run = {frame["run_id"]: frame for _, frame in check_results(server)}
    assert by_run[57]["status"] == "passed"
    assert by_run[57]["metrics"]["path"] == str(scratch)
    assert by_run[57]["metrics"]["bytes"] == 2**20
    assert by_run[58] == {
        "type": "check_result",
        "run_id": 58,
        "status": "error",
        "metrics": {},
        "message": "unknown check 'x'; this agent runs: gpu_compute, gpu_memory_bandwidth, "
        "nccl, nvml_sanity, storage",
    }
    assert list(scratch.iterdir()) == []


def test_a_result_finished_while_disconnected_is_sent_after_the_next_welcome(tmp_path):
    backend = SimulatedBackend(NODE, gpu_count=2)
    runner = SimulatedCheckRunner(backend, tmp_path, duration_s=0.3)

    async def scenario():
        async with FakeServer() as server:
            tokens = {}

            async def on_first_welcome(connection):
                if connection is not server.connections[0]:
                    return
                await connection.ws.send(
                    '{"type": "run_check", "run_id": 61, "check": "gpu_compute",'
                    ' "params": {"min_tflops": 711}}'
                )
                # Gone before the check ends, and refusing the agent until it has.
                tokens["join"], tokens["node"] = set(server.join_tokens), set(server.node_tokens)
                server.join_tokens.clear()
                server.node_tokens.clear()
                await connection.ws.close(1001, "server restart")

            server.on_welcome = on_first_welcome
            client = make_client(server, tmp_path, backend, runner)
            async with running(client):
                # the check ended while the agent was refused: its result waits in the client
                await until(lambda: client._unsent_results, timeout_s=5)
                refused_meanwhile = len(server.connections) - 1
                server.join_tokens |= tokens["join"]  # the server is back
                server.node_tokens |= tokens["node"]
                await until(lambda: check_results(server), timeout_s=5)
            return server, refused_meanwhile

    server, refused_meanwhile = asyncio.run(scenario())

    [(number, result)] = check_results(server)
    assert result["run_id"] == 61
    assert result["status"] == "passed"
    assert result["metrics"]["simulated"] is True
    assert refused_meanwhile >= 1  # the agent tried, and was refused, while it ran
    connection = server.connections[number]
    assert number > refused_meanwhile
    assert connection.welcomed
    assert connection.frames[0]["type"] == "hello"
    assert connection.frames.index(result) > 0
