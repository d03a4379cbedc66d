"""Commands from the server (shared/PROTOCOL.md `command`), through the client and a real
WebSocket server on 127.0.0.1 (fake_server.FakeServer): a reboot is accepted and the
reboot command runs once, whatever the server resends; an unknown action fails; a reboot
command that cannot start fails; a simulated node reboots: it comes back with a new boot
id and without its faults, and in the fleet only that node does."""

import asyncio
import contextlib
import shlex
import time
from argparse import Namespace

import pytest

from agent.config import (
    Config,
    ConfigError,
    build_config,
    parse_inject,
    read_config_file,
)
from agent.connection.client import AgentClient
from agent.connection.node_token import read_node_token
from agent.connection.outbox import Outbox
from agent.hygiene import Hygiene
from agent.node import Node, make_command_handler
from agent.tests.fake_pynvml import FakeNvml
from agent.node_metrics import NodeMetrics
from agent.sim import fleet
from agent.sim.backend import SimulatedBackend, simulated_gpu_uuid
from agent.sim.boot import SimulatedReboot, simulated_boot_id
from agent.sim.node import simulated_command_handler
from agent.tests.fake_server import FakeServer, until
from agent.work.commands import CommandFailed, RebootCommand

NODE = "gpu-001"
SERVER = "wss://clusterui.example.com/ws/agent/"
REBOOT = {"type": "command", "id": 91, "action": "reboot", "params": {}}
HW_THERMAL = 0x40


def make_client(server, state_dir, command_handler, *, backend=None, boot_id="boot-1"):
    backend = backend or SimulatedBackend(NODE, gpu_count=2)
    config = Config(server=server.url, token="join-1", node_name=NODE,
                    state_dir=str(state_dir), sample_interval_s=0.05)
    node = Node(name=NODE, boot_id=boot_id, backend=backend, node_metrics=NodeMetrics(),
                command_handler=command_handler)
    return AgentClient(
        config,
        node,
        node_token=read_node_token(state_dir),
        outbox=Outbox(state_dir / "outbox.sqlite3"),
        backoff_base_s=0.01,
        backoff_cap_s=0.05,
    )


@contextlib.asynccontextmanager
async def running(*clients):
    tasks = [asyncio.create_task(client.run()) for client in clients]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for client in clients:
            client._outbox.close()


def command_results(server):
    return [frame for connection in server.connections
            for frame in connection.of_type("command_result")]


def appending(path):
    """A harmless reboot command: one line in `path` each time it runs."""
    return f"sh -c {shlex.quote(f'echo rebooted >> {path}')}"


def test_a_reboot_is_accepted_and_its_command_runs_once_however_often_it_is_resent(tmp_path):
    ran = tmp_path / "rebooted"
    handler = RebootCommand(appending(ran))

    async def scenario():
        async with FakeServer() as server:
            server.after_welcome = [REBOOT, REBOOT]  # and again at every reconnect
            async with running(make_client(server, tmp_path, handler)):
                await until(lambda: len(command_results(server)) == 2 and ran.exists())
                await server.connections[0].ws.close(1001, "server restart")
                await until(lambda: len(command_results(server)) == 4)
                await asyncio.sleep(0.3)  # time enough for a second run to show
            return server

    server = asyncio.run(scenario())

    assert ran.read_text() == "rebooted\n"
    accepted = {"type": "command_result", "id": 91, "status": "accepted", "message": ""}
    assert command_results(server) == [accepted] * 4
    assert len(server.connections) == 2


def test_an_unknown_action_fails_and_a_command_without_an_integer_id_is_ignored(
        tmp_path, caplog):
    ran = tmp_path / "rebooted"

    async def scenario():
        async with FakeServer() as server:
            server.after_welcome = [
                {"type": "command", "id": 92, "action": "poweroff", "params": {}},
                {"type": "command", "id": "93", "action": "reboot", "params": {}},
                {"type": "command", "id": 94, "action": "reboot", "params": {}},
            ]
            async with running(make_client(server, tmp_path, RebootCommand(appending(ran)))):
                await until(lambda: len(command_results(server)) == 2 and ran.exists())
            return server

    server = asyncio.run(scenario())

    assert command_results(server) == [
        {"type": "command_result", "id": 92, "status": "failed",
         "message": "action poweroff is not supported by this agent version"},
        {"type": "command_result", "id": 94, "status": "accepted", "message": ""},
    ]
    assert "ignoring a command without an integer id" in caplog.text


def test_a_reboot_command_that_fails_is_answered_failed_after_accepted(tmp_path):
    handler = RebootCommand("sh -c 'echo inhibited by a logind lock >&2; exit 1'")

    async def scenario():
        async with FakeServer() as server:
            server.after_welcome = [REBOOT]
            async with running(make_client(server, tmp_path, handler)):
                await until(lambda: len(command_results(server)) == 2)
            return server

    server = asyncio.run(scenario())

    assert [(frame["status"], frame["message"]) for frame in command_results(server)] == [
        ("accepted", ""),
        ("failed", "the reboot command `sh -c 'echo inhibited by a logind lock >&2; exit 1'` "
                   "exited with 1: inhibited by a logind lock"),
    ]


@pytest.mark.parametrize("command, timeout_s, message", [
    ("/nonexistent/reboot", 5.0,
     "cannot run the reboot command `/nonexistent/reboot`: No such file or directory"),
    ("sleep 30", 0.2, "the reboot command `sleep 30` did not finish within 0.2 s (stopped)"),
])
def test_a_reboot_command_that_cannot_start_the_reboot_fails_with_why(command, timeout_s,
                                                                      message):
    handler = RebootCommand(command, start_timeout_s=timeout_s)
    started = time.monotonic()
    with pytest.raises(CommandFailed) as failed:
        asyncio.run(handler.run("reboot", {}, client=None))
    assert str(failed.value) == message
    assert time.monotonic() - started < 5


def test_a_simulated_node_comes_back_after_its_boot_with_a_new_boot_id_and_no_faults(tmp_path):
    faults = parse_inject("gpu_lost@0s:gpu1,thermal@0s:gpu0")
    backend = SimulatedBackend(NODE, gpu_count=2, faults=faults)
    first_boot = simulated_boot_id(str(tmp_path))
    handler = SimulatedReboot(backend, str(tmp_path), boot_s=0.3)
    welcomed_at = []

    async def scenario():
        async with FakeServer() as server:
            async def on_welcome(connection):
                welcomed_at.append(time.monotonic())
                if connection is server.connections[0]:
                    await until(lambda: len(connection.of_type("sample")) >= 2)
                    await connection.ws.send('{"type": "command", "id": 91, '
                                             '"action": "reboot", "params": {}}')

            server.on_welcome = on_welcome
            client = make_client(server, tmp_path, handler, backend=backend, boot_id=first_boot)
            async with running(client):
                await until(lambda: len(server.connections) == 2
                            and len(server.connections[1].of_type("sample")) >= 2)
            return server, client

    (server, client) = asyncio.run(scenario())

    before, after = server.connections
    assert before.of_type("command_result") == [
        {"type": "command_result", "id": 91, "status": "accepted", "message": ""}]
    assert before.close_code == 1001
    [hello_before], [hello_after] = before.of_type("hello"), after.of_type("hello")
    assert hello_before["boot_id"] == first_boot
    assert hello_after["boot_id"] != first_boot
    assert hello_after["boot_id"] == (tmp_path / "simulated_boot_id").read_text().strip()
    assert hello_after["boot_id"] == client.boot_id == simulated_boot_id(str(tmp_path))
    assert welcomed_at[1] - welcomed_at[0] >= 0.3  # down for the boot
    # The lost GPU is back, and the thermal slowdown is gone.
    assert [gpu["index"] for gpu in hello_before["gpus"]] == [0]
    assert [gpu["index"] for gpu in hello_after["gpus"]] == [0, 1]
    assert all(gpu["clock_event_reasons"] & HW_THERMAL for sample in before.of_type("sample")
               for gpu in sample["gpus"])
    for sample in after.of_type("sample"):
        assert [gpu["uuid"] for gpu in sample["gpus"]] == [
            simulated_gpu_uuid(NODE, 0), simulated_gpu_uuid(NODE, 1)]
        assert not any(gpu["clock_event_reasons"] & HW_THERMAL for gpu in sample["gpus"])


def test_in_the_fleet_only_the_node_asked_reboots(tmp_path):
    (tmp_path / "gpu-001").mkdir()
    (tmp_path / "gpu-001" / "inject").write_text("gpu_lost@0s:gpu1\n")

    async def scenario():
        async with FakeServer() as server:
            async def on_welcome(connection):
                hello = connection.of_type("hello")[0]
                if hello["node"] == "gpu-001" and len(hellos(server, "gpu-001")) == 1:
                    await connection.ws.send(
                        '{"type": "command", "id": 5, "action": "reboot", "params": {}}')

            server.on_welcome = on_welcome
            args = Namespace(server=server.url, state_dir=str(tmp_path), token="join-1",
                             tls=None, gpus=2, sample_interval=0.05, simulated_boot=0.1,
                             workload=None)
            built = [fleet.build_client(name, args) for name in ("gpu-001", "gpu-002")]
            async with running(*(client for client, _ in built)):
                await until(lambda: len(hellos(server, "gpu-001")) == 2
                            and len(hellos(server, "gpu-002")) == 1)
                await asyncio.sleep(0.3)
            return server

    server = asyncio.run(scenario())

    rebooted, untouched = hellos(server, "gpu-001"), hellos(server, "gpu-002")
    assert rebooted[0]["boot_id"] != rebooted[1]["boot_id"]
    assert [len(hello["gpus"]) for hello in rebooted] == [1, 2]
    assert len(untouched) == 1
    assert untouched[0]["boot_id"] == simulated_boot_id(str(tmp_path / "gpu-002"))


def hellos(server, node):
    return [frame for connection in server.connections for frame in connection.of_type("hello")
            if frame["node"] == node]


# Settings


def options(**given):
    names = ("server", "token", "state_dir", "node_name", "sample_interval", "throttle_hold",
             "kmsg", "reboot_command", "simulate", "simulated_boot", "gpus", "inject",
             "print_once", "verbose")
    return {name: given.get(name) for name in names}


def test_the_reboot_command_comes_from_the_file_or_the_command_line(tmp_path):
    path = tmp_path / "agent.toml"
    path.write_text(f'server = "{SERVER}"\nreboot_command = "/usr/sbin/reboot --force"\n')
    assert build_config(options(server=SERVER, node_name=NODE)).reboot_command == (
        "systemctl reboot")
    assert build_config(options(node_name=NODE), read_config_file(path)).reboot_command == (
        "/usr/sbin/reboot --force")
    assert build_config(options(node_name=NODE, reboot_command="ipmitool power cycle"),
                        read_config_file(path)).reboot_command == "ipmitool power cycle"


@pytest.mark.parametrize("given, error", [
    ({"reboot_command": "sh -c 'unclosed"}, "reboot command \"sh -c 'unclosed\": No closing"),
    ({"reboot_command": "  "}, "the reboot command is empty"),
    ({"reboot_command": "reboot", "simulate": True}, "--reboot-command does not apply"),
    ({"simulated_boot": 3.0}, "--simulated-boot only applies with --simulate"),
    ({"simulated_boot": 601.0, "simulate": True}, "--simulated-boot 601 s: 0 to 600 s"),
])
def test_bad_reboot_settings_are_usage_errors(given, error):
    with pytest.raises(ConfigError, match=error.replace("(", r"\(")):
        build_config(options(server=SERVER, node_name=NODE, **given))


def test_the_agent_reboots_with_the_reboot_command_or_in_simulation(tmp_path):
    real = build_config(options(server=SERVER, node_name=NODE, reboot_command="true"))
    handler = make_command_handler(real, hygiene=Hygiene(), nvml=FakeNvml())
    assert handler.actions == ("reboot", "reset_gpu", "collect_bundle")
    reboot = handler._by_action["reboot"]
    assert isinstance(reboot, RebootCommand) and reboot.command == "true"

    simulated = build_config(options(server=SERVER, node_name=NODE, simulate=True,
                                     simulated_boot=0.5, state_dir=str(tmp_path)))
    handler = simulated_command_handler(simulated, SimulatedBackend(NODE, gpu_count=1),
                                        hygiene=Hygiene())
    reboot = handler._by_action["reboot"]
    assert isinstance(reboot, SimulatedReboot) and reboot._boot_s == 0.5
