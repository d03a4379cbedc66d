"""Check runs over the agent WebSocket (PROTOCOL.md run_check / check_result)."""

import pytest
from channels.db import database_sync_to_async

from healthchecks.models import CheckRun, HealthEvent
from healthchecks.services import do_request_check
from nodes.models import Node
from gateway.publisher import Publisher
from gateway.tests.test_consumers import join, receive, send

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def no_boot_window(in_memory_channel_layer, settings):
    settings.CLUSTERUI_BOOT_WINDOW_S = 0


async def request_check(name, check):
    node = await database_sync_to_async(Node.objects.get)(name=name)
    run, _ = await database_sync_to_async(do_request_check)(node, check)
    return run


async def test_a_requested_check_reaches_the_connected_agent_and_its_result_is_kept(join_token):
    communicator, _ = await join(join_token)
    run = await request_check("gpu-001", "gpu_compute")
    await Publisher().push_changes()  # the change feed offers it to the connection

    frame = await receive(communicator)
    assert frame == {"type": "run_check", "run_id": run.pk, "check": "gpu_compute",
                     "params": {"min_tflops": 709.2}}
    await database_sync_to_async(run.refresh_from_db)()
    assert run.status == CheckRun.Status.RUNNING and run.sent_at is not None

    await send(communicator, {"type": "check_result", "run_id": run.pk, "status": "failed",
                              "metrics": {"tflops": 540.2}, "message": "GPU 3: 540.2 TFLOP/s"})
    await send(communicator, {"type": "check_result", "run_id": 999999, "status": "passed"})
    error = await receive(communicator)
    assert error == {"type": "error", "code": "bad_message",
                     "message": "check_result.run_id: no run 999999 for this node"}
    await database_sync_to_async(run.refresh_from_db)()
    assert run.status == CheckRun.Status.FAILED and run.metrics == {"tflops": 540.2}
    assert await database_sync_to_async(
        HealthEvent.objects.filter(signature="check:gpu_compute", closed_at=None).exists)()
    await communicator.disconnect()


async def test_a_run_asked_while_the_agent_was_away_goes_out_after_its_hello(join_token):
    communicator, welcome = await join(join_token)
    await communicator.disconnect()
    run = await request_check("gpu-001", "nvml_sanity")

    communicator, _ = await join(welcome["node_token"])
    frame = await receive(communicator)
    assert frame["type"] == "run_check" and frame["run_id"] == run.pk
    assert frame["params"] == {"expected_gpus": 8, "pcie_gen": 5, "pcie_width": 16}
    await communicator.disconnect()

    # Sent but unanswered when the connection dropped: sent again at the next hello.
    communicator, _ = await join(welcome["node_token"])
    assert (await receive(communicator))["run_id"] == run.pk
    await send(communicator, {"type": "check_result", "run_id": run.pk, "status": "passed",
                              "metrics": {}, "message": ""})
    await communicator.disconnect()
    await database_sync_to_async(run.refresh_from_db)()
    assert run.status == CheckRun.Status.PASSED


async def test_a_new_node_of_a_cluster_with_acceptance_tests_gets_the_battery(cluster, join_token):
    cluster.acceptance_tests_enabled = True
    await database_sync_to_async(cluster.save)()
    communicator, _ = await join(join_token)
    checks = [(await receive(communicator))["check"] for _ in range(4)]
    assert checks == ["nvml_sanity", "gpu_compute", "gpu_memory_bandwidth", "storage"]
    node = await database_sync_to_async(Node.objects.get)(name="gpu-001")
    assert (node.state, node.state_reason) == ("pending", "running acceptance tests")
    await communicator.disconnect()
