"""The agent socket and startup scripts: delivery in `config` (at hello and on change), and
script_result frames (WebsocketCommunicator, InMemoryChannelLayer)."""

import pytest
from channels.db import database_sync_to_async

from nodes.choices import NodeState
from nodes.models import Node
from startup.models import ScriptRun
from gateway.publisher import Publisher
from startup.services import Validation, do_save_startup_script
from gateway.tests.test_consumers import connect, hello, receive, send

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("in_memory_channel_layer")]


def save(cluster, body, event="node_boot", role="worker"):
    return do_save_startup_script(cluster, event=event, role=role, body=body, timeout_s=30,
                                  validation=Validation())


async def frames_until(communicator, kind):
    while True:
        frame = await receive(communicator)
        if frame["type"] == kind:
            return frame


async def test_config_after_welcome_carries_the_scripts_and_comes_again_on_change(
        cluster, join_token, settings):
    settings.CLUSTERUI_BOOT_WINDOW_S = 0
    version = await database_sync_to_async(save)(cluster, "echo one\n")
    await database_sync_to_async(save)(cluster, "echo login\n", role="login")
    communicator = await connect(join_token)
    await send(communicator, hello())
    assert (await receive(communicator))["type"] == "welcome"
    config = await receive(communicator)
    assert config["type"] == "config"
    assert config["startup_scripts"] == [
        {"id": version.script_id, "version": 1, "event": "node_boot", "role": "worker",
         "timeout_s": 30, "body": "echo one\n"}]
    node = await database_sync_to_async(Node.objects.get)(name="gpu-001")
    assert node.boot_tasks_running and node.state == NodeState.BOOTING

    await database_sync_to_async(save)(cluster, "echo two\n", event="job_start")
    await Publisher().push_changes()  # the change feed tells the connection
    config = await frames_until(communicator, "config")
    assert [(s["event"], s["body"]) for s in config["startup_scripts"]] == [
        ("job_start", "echo two\n"), ("node_boot", "echo one\n")]

    await send(communicator, {"type": "script_result", "script_id": version.script_id,
                              "version": 1, "event": "node_boot", "job_id": None,
                              "exit_code": 0, "duration_s": 0.2, "output_tail": "one\n"})
    await send(communicator, {"type": "script_result", "script_id": version.script_id,
                              "event": "node_boot", "exit_code": "0", "duration_s": 0.2})
    error = await frames_until(communicator, "error")
    assert error["message"].startswith("script_result.exit_code")
    run = await database_sync_to_async(ScriptRun.objects.get)()
    assert (run.exit_code, run.output_tail, run.version_id) == (0, "one\n", version.pk)
    node = await database_sync_to_async(Node.objects.get)(name="gpu-001")
    assert not node.boot_tasks_running and node.state == NodeState.HEALTHY
    await communicator.disconnect()
