"""The live publisher runs the slow GPU rule on each tick and writes what it decides."""

from datetime import datetime, timedelta, timezone as dt_timezone

import pytest
from channels.db import database_sync_to_async
from channels.layers import InMemoryChannelLayer

from healthchecks.models import HealthEvent
from healthchecks.tests.test_slow_gpus import AT_LOAD, CAPPED
from nodes.choices import NodeState
from gateway.protocol import live_sample
from nodes.live_store import MemoryLiveStore
from nodes.models import Node
from gateway.publisher import Publisher

from nodes.tests.factories import GpuFactory, NodeFactory

START = datetime(2026, 11, 29, 14, 2, tzinfo=dt_timezone.utc)


def make_fleet(cluster):
    """Two nodes of 8 H200s each; returns [(node, [Gpu])]."""
    fleet = []
    for _ in range(2):
        node = NodeFactory(cluster=cluster)
        fleet.append((node, [GpuFactory(node=node, index=i) for i in range(8)]))
    return fleet


def record_tick(store, cluster, fleet, second, *, slow_gpu=None, slow=CAPPED):
    at = (START + timedelta(seconds=second)).timestamp()
    for node, gpus in fleet:
        readings = [{"uuid": gpu.uuid, **(slow if gpu == slow_gpu else
                                          AT_LOAD[(second + 7 * gpu.index) % len(AT_LOAD)])}
                    for gpu in gpus]
        frame = {"type": "sample", "seq": second, "ts": at, "gpus": readings, "node": {}}
        store.record(cluster.pk, live_sample(frame, node_id=node.pk, received_at=at - 0.2,
                                            memory_totals={}))


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_publisher_opens_and_closes_slow_gpu(cluster, settings):
    settings.CLUSTERUI_SLOW_GPU_HOLD_S = 5
    settings.CLUSTERUI_SLOW_GPU_CLEAR_S = 3
    fleet = await database_sync_to_async(make_fleet)(cluster)
    node, gpus = fleet[0]
    slow_gpu = gpus[3]
    store = MemoryLiveStore()
    publisher = Publisher(store=store, channel_layer=InMemoryChannelLayer())
    events = HealthEvent.objects.filter(signature="slow_gpu")

    for second in range(5):
        record_tick(store, cluster, fleet, second, slow_gpu=slow_gpu)
        await publisher.publish_once(now=START + timedelta(seconds=second))
    assert not await database_sync_to_async(events.exists)()  # held 4 s of 5

    record_tick(store, cluster, fleet, 5, slow_gpu=slow_gpu)
    await publisher.publish_once(now=START + timedelta(seconds=5))
    event = await database_sync_to_async(events.select_related("gpu").get)()
    assert (event.gpu_id, event.severity, event.source) == (slow_gpu.pk, "warning", "passive")
    assert event.evidence["sm_clock_mhz"] == 1110 and event.evidence["peers"] == 15
    node_now = await database_sync_to_async(Node.objects.get)(pk=node.pk)
    assert node_now.state == NodeState.UNHEALTHY
    assert node_now.state_reason == "slow_gpu on GPU 3"

    for second in range(6, 12):  # still slow: counted once; then fast again from 12 s
        record_tick(store, cluster, fleet, second, slow_gpu=slow_gpu)
        await publisher.publish_once(now=START + timedelta(seconds=second))
    for second in range(12, 16):
        record_tick(store, cluster, fleet, second)
        await publisher.publish_once(now=START + timedelta(seconds=second))

    event = await database_sync_to_async(events.get)()
    assert event.count == 1
    assert event.closed_at == START + timedelta(seconds=15)
    assert event.closed_reason == "SM clock back above 85% of its peers' median for 3 s"
    node_now = await database_sync_to_async(Node.objects.get)(pk=node.pk)
    assert node_now.state == NodeState.HEALTHY


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_slow_gpu_closed_by_hand_while_still_slow_opens_again(cluster, settings):
    """The publisher reads the open events each tick: it never trusts its own memory of them."""
    from healthchecks.services import do_close_health_event

    settings.CLUSTERUI_SLOW_GPU_HOLD_S = 2
    fleet = await database_sync_to_async(make_fleet)(cluster)
    slow_gpu = fleet[1][1][5]
    store = MemoryLiveStore()
    publisher = Publisher(store=store, channel_layer=InMemoryChannelLayer())
    events = HealthEvent.objects.filter(signature="slow_gpu", gpu=slow_gpu)

    for second in range(3):
        record_tick(store, cluster, fleet, second, slow_gpu=slow_gpu)
        await publisher.publish_once(now=START + timedelta(seconds=second))
    first = await database_sync_to_async(events.get)()
    await database_sync_to_async(do_close_health_event)(first, reason="resolved by hand")
    record_tick(store, cluster, fleet, 3, slow_gpu=slow_gpu)
    await publisher.publish_once(now=START + timedelta(seconds=3))

    assert await database_sync_to_async(events.filter(closed_at__isnull=True).count)() == 1
    assert await database_sync_to_async(events.count)() == 2
