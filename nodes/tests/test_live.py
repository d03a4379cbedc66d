"""The live path: store -> publisher -> browsers, rollups, last_seen and heartbeats."""

import json
import time
from datetime import datetime, timedelta, timezone as dt_timezone

import pytest
from channels.db import database_sync_to_async
from channels.layers import InMemoryChannelLayer
from channels.testing import WebsocketCommunicator
from django.utils import timezone

from clusterui.asgi import application
from healthchecks.models import HealthEvent
from nodes.choices import NodeState
from healthchecks.heartbeats import sweep_heartbeats
from gateway.protocol import live_sample
from nodes.live_store import MemoryLiveStore
from nodes.models import ClusterRollup, Node, NodeRollup, PublisherStatus
from common.groups import cluster_group
from gateway.publisher import Publisher
from nodes.rollups import prune_rollups

from .factories import NodeFactory

GIB = 2**30


def entry(node, util, mem_used, *, received_at, net=1e9, sm_active=None):
    frame = {"type": "sample", "seq": 1, "ts": received_at,
             "gpus": [{"uuid": f"{node.name}-GPU-{i}", "util_pct": util, "mem_used_bytes": mem_used,
                       "temp_c": 50 + i, "power_w": 600.0, "sm_active_pct": sm_active}
                      for i in range(2)],
             "node": {"net_rx_bps": net, "net_tx_bps": net, "cpu_pct": 10.0}}
    totals = {f"{node.name}-GPU-{i}": 100 * GIB for i in range(2)}
    return live_sample(frame, node_id=node.pk, received_at=received_at, memory_totals=totals)


@pytest.fixture
def layer():
    return InMemoryChannelLayer()


async def next_summary(layer, channel):
    message = await layer.receive(channel)
    return message["summary"]


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_publisher_sends_one_summary_per_cluster_from_the_live_store(cluster, layer,
                                                                                settings):
    settings.CLUSTERUI_SAMPLE_INTERVAL_S = 1.0
    a = await database_sync_to_async(NodeFactory)(cluster=cluster, state=NodeState.HEALTHY)
    b = await database_sync_to_async(NodeFactory)(cluster=cluster, state=NodeState.UNHEALTHY)
    stale = await database_sync_to_async(NodeFactory)(cluster=cluster, state=NodeState.HEALTHY,
                                                      last_seen=None)
    now = datetime.now(tz=dt_timezone.utc)
    store = MemoryLiveStore()
    store.record(cluster.pk, entry(a, 100, 50 * GIB, received_at=now.timestamp() - 0.5,
                                   sm_active=90.0))
    store.record(cluster.pk, entry(b, 50, 25 * GIB, received_at=now.timestamp() - 1.0))  # no GPM
    store.record(cluster.pk, entry(stale, 0, 0, received_at=now.timestamp() - 30))
    channel = await layer.new_channel()
    await layer.group_add(cluster_group(cluster.slug), channel)

    await Publisher(store=store, channel_layer=layer).publish_once(now=now)

    summary = await next_summary(layer, channel)
    assert summary["counts"] == {"healthy": 2, "unhealthy": 1, "booting": 0, "pending": 0,
                                 "paused": 0}
    assert summary["usage"] == {"gpus_reporting": 4, "gpu_util_pct": 75.0,
                                "gpu_mem_used_pct": 37.5, "net_gbps": 32.0,
                                "gpu_sm_active_pct": 90.0}  # of the GPUs that report it
    a_seen = await database_sync_to_async(Node.objects.get)(pk=a.pk)
    stale_seen = await database_sync_to_async(Node.objects.get)(pk=stale.pk)
    assert abs(a_seen.last_seen.timestamp() - (now.timestamp() - 0.5)) < 1.0
    assert stale_seen.last_seen is None  # a stale entry is not news
    status = await database_sync_to_async(PublisherStatus.objects.get)()
    assert status.seen_at == now


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_finished_minute_is_written_as_rollups(cluster, layer):
    node = await database_sync_to_async(NodeFactory)(cluster=cluster)
    store = MemoryLiveStore()
    publisher = Publisher(store=store, channel_layer=layer)
    minute = datetime(2026, 11, 29, 14, 2, tzinfo=dt_timezone.utc)
    for second, util in [(0, 100), (20, 50), (40, 0)]:
        at = minute + timedelta(seconds=second)
        store.record(cluster.pk, entry(node, util, 10 * GIB, received_at=at.timestamp(),
                                       sm_active=util * 0.8))
        await publisher.publish_once(now=at)
    await publisher.publish_once(now=minute + timedelta(minutes=1))

    rollup = await database_sync_to_async(ClusterRollup.objects.get)(cluster=cluster)
    assert (rollup.minute, rollup.gpu_util_pct, rollup.gpu_mem_used_pct) == (minute, 50.0, 10.0)
    assert rollup.gpus_reporting == 2 and rollup.gpu_sm_active_pct == 40.0
    node_rollup = await database_sync_to_async(NodeRollup.objects.get)(node=node)
    gpu0 = node_rollup.gpus[f"{node.name}-GPU-0"]
    assert gpu0["util_pct"] == [50.0, 100] and gpu0["temp_c"] == [50.0, 50]
    assert gpu0["sm_active_pct"] == [40.0, 80.0]
    assert node_rollup.node_metrics["net_rx_bps"] == [1e9, 1e9]


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_readings_no_machine_makes_do_not_break_the_minute_or_the_summary(cluster, layer):
    """PROTOCOL.md lets any finite number through; 1e308 twice is infinity, which jsonb
    refuses (the whole minute's rollups failed: the 10,000-frame fuzz found it) and a
    browser's JSON.parse too. Such readings are left out of sums and means."""
    node = await database_sync_to_async(NodeFactory)(cluster=cluster)
    store = MemoryLiveStore()
    publisher = Publisher(store=store, channel_layer=layer)
    channel = await layer.new_channel()
    await layer.group_add(cluster_group(cluster.slug), channel)
    minute = datetime(2026, 11, 29, 14, 2, tzinfo=dt_timezone.utc)
    for second in (0, 20, 40):
        at = minute + timedelta(seconds=second)
        store.record(cluster.pk, entry(node, 1e308, 10 * GIB, received_at=at.timestamp(),
                                       net=1.7e308))
        await publisher.publish_once(now=at)
        summary = await next_summary(layer, channel)
        json.loads(json.dumps(summary), parse_constant=pytest.fail)  # no Infinity in it
    await publisher.publish_once(now=minute + timedelta(minutes=1))
    node_rollup = await database_sync_to_async(NodeRollup.objects.get)(node=node)
    assert node_rollup.gpus[f"{node.name}-GPU-0"]["util_pct"] == [None, None]
    assert node_rollup.gpus[f"{node.name}-GPU-0"]["temp_c"] == [50.0, 50]
    assert node_rollup.node_metrics["net_rx_bps"] == [None, None]


@pytest.mark.django_db
def test_old_rollups_are_pruned(cluster, settings):
    settings.CLUSTERUI_ROLLUP_RETENTION_DAYS = 30
    now = timezone.now()
    for days in (1, 31):
        ClusterRollup.objects.create(cluster=cluster, minute=now - timedelta(days=days),
                                     gpus_reporting=8, gpu_util_pct=1, gpu_mem_used_pct=1,
                                     net_bps=0)
    assert prune_rollups(now=now) == 1
    assert ClusterRollup.objects.count() == 1


def publisher_ran(started_ago, last_ran_ago, now):
    PublisherStatus.objects.update_or_create(pk=1, defaults={
        "started_at": now - timedelta(seconds=started_ago),
        "seen_at": now - timedelta(seconds=last_ran_ago)})


@pytest.mark.django_db
def test_a_silent_node_loses_its_heartbeat_and_gets_it_back(cluster, settings):
    settings.CLUSTERUI_SAMPLE_INTERVAL_S = 1.0
    settings.CLUSTERUI_HEARTBEAT_INTERVALS = 3
    start = timezone.now()
    node = NodeFactory(cluster=cluster, state=NodeState.HEALTHY,
                       last_seen=start - timedelta(seconds=2))
    never = NodeFactory(cluster=cluster, state=NodeState.PENDING, last_hello_at=None,
                        last_seen=None)

    def sweep(after_s):
        now = start + timedelta(seconds=after_s)
        publisher_ran(started_ago=3600, last_ran_ago=0, now=now)  # the console is listening
        return sweep_heartbeats(now=now)

    assert sweep(0) == (0, 0)
    assert sweep(1.5) == (1, 0)
    assert sweep(2) == (0, 0)  # one open event, not two
    node.refresh_from_db()
    assert (node.state, node.state_reason) == (NodeState.UNHEALTHY, "heartbeat_lost")

    Node.objects.filter(pk=node.pk).update(last_seen=start + timedelta(seconds=3))
    assert sweep(4) == (0, 1)
    node.refresh_from_db()
    assert node.state == NodeState.HEALTHY
    never.refresh_from_db()
    assert never.state == NodeState.PENDING


@pytest.mark.django_db
@pytest.mark.parametrize("started_ago, last_ran_ago", [
    (3600, 299),  # the console (its publisher) stopped with the node: nobody was listening
    (10, 0),  # it just started, and has not heard the node since: it is reconnecting
])
def test_silence_is_not_judged_while_nobody_listened(cluster, started_ago, last_ran_ago):
    now = timezone.now()
    publisher_ran(started_ago, last_ran_ago, now)
    node = NodeFactory(cluster=cluster, last_seen=now - timedelta(minutes=5))
    assert sweep_heartbeats(now=now) == (0, 0)
    node.refresh_from_db()
    assert node.state == NodeState.HEALTHY


@pytest.mark.django_db
def test_after_a_start_or_handover_the_nodes_still_heard_are_judged_at_once(cluster):
    """A publisher took over 10 s ago (its predecessor's server died with its agents): the
    nodes the console kept hearing are watched; the ones reconnecting get their grace."""
    now = timezone.now()
    publisher_ran(started_ago=10, last_ran_ago=0, now=now)
    kept = NodeFactory(cluster=cluster, name="kept", last_seen=now - timedelta(seconds=6))
    reconnecting = NodeFactory(cluster=cluster, name="reconnecting",
                               last_seen=now - timedelta(seconds=11))
    assert sweep_heartbeats(now=now) == (1, 0)
    assert HealthEvent.objects.open().get(signature="heartbeat_lost").node == kept
    reconnecting.refresh_from_db()
    assert reconnecting.state == NodeState.HEALTHY


@pytest.mark.django_db
def test_a_paused_node_records_a_lost_heartbeat_but_stays_paused(cluster, operator):
    from nodes.services import do_pause_node

    publisher_ran(started_ago=3600, last_ran_ago=0, now=timezone.now())
    node = NodeFactory(cluster=cluster, last_seen=timezone.now() - timedelta(minutes=5))
    do_pause_node(node, actor=operator, reason="maintenance")
    sweep_heartbeats()
    node.refresh_from_db()
    assert node.state == NodeState.PAUSED
    assert HealthEvent.objects.open().get(node=node).signature == "heartbeat_lost"


async def browser(user, slug, origin=b"http://localhost"):
    from asgiref.sync import sync_to_async
    from django.test import Client

    client = Client()
    await sync_to_async(client.force_login)(user) if user else None
    headers = [(b"origin", origin)]
    if user:
        headers.append((b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()))
    communicator = WebsocketCommunicator(application, f"/ws/live/cluster/{slug}/",
                                         headers=headers)
    return communicator, await communicator.connect()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_signed_in_browser_gets_the_summaries(in_memory_channel_layer, cluster, viewer):
    from channels.layers import get_channel_layer

    communicator, (connected, _) = await browser(viewer, cluster.slug)
    assert connected
    await get_channel_layer().group_send(cluster_group(cluster.slug), {
        "type": "cluster.summary", "summary": {"cluster": cluster.slug, "counts": {}}})
    assert json.loads(await communicator.receive_from(timeout=5))["cluster"] == cluster.slug
    await communicator.disconnect()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("who, origin, slug", [
    ("anonymous", b"http://localhost", "prod-h200"),
    ("outsider", b"http://localhost", "prod-h200"),
    ("viewer", b"http://evil.example", "prod-h200"),
    ("viewer", b"http://localhost", "no-such-cluster"),
])
async def test_the_live_socket_refuses_strangers(in_memory_channel_layer, cluster, viewer,
                                                 outsider, who, origin, slug):
    user = {"anonymous": None, "outsider": outsider, "viewer": viewer}[who]
    _, (connected, _) = await browser(user, slug, origin=origin)
    assert not connected


def test_a_sample_keeps_what_the_overview_needs():
    class FakeNode:
        pk, name = 7, "gpu-007"

    store = MemoryLiveStore()
    store.record(1, entry(FakeNode, 99, 5 * GIB, received_at=time.time()))
    kept = store.read_node(1, 7)
    assert kept["node_id"] == 7 and kept["gpus"][0]["mem_total_bytes"] == 100 * GIB


def test_a_live_entry_keeps_the_protocols_fields_and_nothing_else():
    """A sample may carry fields this server does not know, of any size and depth; the store
    (Redis, every second) keeps only the readings."""
    deep = {}
    inner = deep
    for _ in range(900):
        inner["x"] = {}
        inner = inner["x"]
    frame = {"type": "sample", "seq": 3, "ts": 1.5, "future": "f" * 500_000,
             "gpus": [{"uuid": "GPU-1", "temp_c": 55, "vendor_extra": deep}],
             "node": {"cpu_pct": 7.5, "extra": ["e" * 1000]}}
    store = MemoryLiveStore()
    store.record(1, live_sample(frame, node_id=4, received_at=2.0, memory_totals={"GPU-1": 80}))
    assert len(store.latest[1][4]) < 1000
    entry = store.read_node(1, 4)
    [gpu] = entry["gpus"]
    assert gpu["temp_c"] == 55 and gpu["mem_total_bytes"] == 80 and "vendor_extra" not in gpu
    assert entry["node"]["cpu_pct"] == 7.5 and "extra" not in entry["node"]
    assert "future" not in entry
