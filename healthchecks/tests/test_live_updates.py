"""Live updates of the Health checks tab: the services announce "health.changed" to the
cluster's group once their transaction commits, at most once a second per cluster, and the
browsers' live socket passes it on."""

import asyncio
import json
import time

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.db import transaction
from django.test import Client

from clusterui.asgi import application
from clusterui.realtime import Throttle
from clusterui.tests.factories import ClusterFactory
from healthchecks import services
from healthchecks.services import (
    do_acknowledge_event,
    do_close_health_event,
    do_record_health_event,
    do_resolve_event,
)
from nodes.publisher import cluster_group
from nodes.tests.factories import NodeFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def in_memory_channel_layer(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.CLUSTERUI_PUBLISHER = False


@pytest.fixture(autouse=True)
def fresh_throttle(monkeypatch):
    """The services' throttle remembers what it sent: each test starts with none sent."""
    throttle = Throttle(interval_s=services.health_changes.interval_s)
    monkeypatch.setattr(services, "health_changes", throttle)
    return throttle


async def listen(group):
    """A channel of the in-memory layer in `group`, as a browser's consumer has."""
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(group, channel)
    return channel


async def received(channel, within=0.3):
    """The messages that arrive on `channel` within `within` seconds of the last one."""
    messages = []
    while True:
        try:
            messages.append(await asyncio.wait_for(get_channel_layer().receive(channel), within))
        except asyncio.TimeoutError:
            return messages


def record(node, count=1):
    return do_record_health_event(node, signature="xid:79", severity="critical",
                                  message="GPU has fallen off the bus", count=count)


@pytest.mark.asyncio
async def test_recording_an_event_announces_it_once_committed(cluster):
    node = await database_sync_to_async(NodeFactory)(cluster=cluster)
    channel = await listen(cluster_group(cluster.slug))

    await database_sync_to_async(record)(node)

    assert await received(channel) == [{"type": "health.changed", "cluster": cluster.slug}]


@pytest.mark.asyncio
async def test_nothing_is_announced_when_the_transaction_rolls_back(cluster):
    node = await database_sync_to_async(NodeFactory)(cluster=cluster)
    channel = await listen(cluster_group(cluster.slug))

    def record_then_fail():
        with transaction.atomic():
            record(node)
            raise RuntimeError("the caller's transaction fails after the event was recorded")

    with pytest.raises(RuntimeError):
        await database_sync_to_async(record_then_fail)()
    assert await received(channel) == []


@pytest.mark.asyncio
@pytest.mark.parametrize("change", ["acknowledge", "close", "resolve"])
async def test_acknowledging_closing_and_resolving_are_announced(cluster, operator, change,
                                                                 fresh_throttle):
    node = await database_sync_to_async(NodeFactory)(cluster=cluster)
    event = await database_sync_to_async(record)(node)
    fresh_throttle.interval_s = 0  # only the change under test matters here
    channel = await listen(cluster_group(cluster.slug))

    def act():
        if change == "acknowledge":
            return do_acknowledge_event(event, actor=operator)
        if change == "close":
            return do_close_health_event(event, reason="cleared by the agent")
        return do_resolve_event(event, actor=operator, comment="reseated the GPU")

    assert await database_sync_to_async(act)()
    assert await received(channel) == [{"type": "health.changed", "cluster": cluster.slug}]
    # Done already: nothing changed, nothing is announced.
    assert not await database_sync_to_async(act)()
    assert await received(channel) == []


@pytest.mark.asyncio
async def test_a_storm_is_one_message_at_once_and_the_last_change_a_second_later(cluster):
    node = await database_sync_to_async(NodeFactory)(cluster=cluster)
    other = await database_sync_to_async(ClusterFactory)(name="other", slug="other")
    other_node = await database_sync_to_async(NodeFactory)(cluster=other)
    channel = await listen(cluster_group(cluster.slug))
    other_channel = await listen(cluster_group(other.slug))

    started = time.monotonic()
    for _ in range(100):  # an Xid storm the agent did not coalesce: one frame per line
        await database_sync_to_async(record)(node)
    await database_sync_to_async(record)(other_node)
    assert time.monotonic() - started < 0.9, "too slow to fall in one interval"

    first = await asyncio.wait_for(get_channel_layer().receive(channel), 0.5)
    assert first == {"type": "health.changed", "cluster": cluster.slug}
    # Another cluster has its own interval: its change is not held behind this storm.
    assert await asyncio.wait_for(get_channel_layer().receive(other_channel), 0.5)
    # The counts after the first message are not lost: one more message, when the second ends.
    last = await asyncio.wait_for(get_channel_layer().receive(channel), 1.5)
    assert last == {"type": "health.changed", "cluster": cluster.slug}
    assert time.monotonic() - started >= 0.95
    assert await received(channel, within=1.5) == []


def test_the_throttle_sends_the_latest_held_message_when_the_interval_ends():
    """Also from a thread without an event loop (a Celery worker, a management command)."""
    throttle = Throttle(interval_s=0.3)
    channel = async_to_sync(listen)("cluster.a")
    async_to_sync(listen)("cluster.b")

    for n in range(1, 101):
        throttle.broadcast("cluster.a", "health.changed", n=n)
    throttle.broadcast("cluster.b", "health.changed", n=1)
    # The held message goes from a timer thread; collect only once it has gone.
    time.sleep(0.6)
    assert [m["n"] for m in async_to_sync(received)(channel, 0.05)] == [1, 100]

    # A quiet interval later the next message goes at once again.
    throttle.broadcast("cluster.a", "health.changed", n=101)
    assert [m["n"] for m in async_to_sync(received)(channel, 0.05)] == [101]


async def browser(user, slug):
    client = Client()
    await database_sync_to_async(client.force_login)(user)
    communicator = WebsocketCommunicator(
        application, f"/ws/live/cluster/{slug}/",
        headers=[(b"origin", b"http://localhost"),
                 (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())])
    connected, _ = await communicator.connect()
    assert connected
    return communicator


@pytest.mark.asyncio
async def test_the_live_socket_forwards_health_changes_to_the_browser(cluster, viewer):
    node = await database_sync_to_async(NodeFactory)(cluster=cluster)
    communicator = await browser(viewer, cluster.slug)

    await database_sync_to_async(record)(node)

    message = json.loads(await communicator.receive_from(timeout=5))
    assert message == {"type": "health.changed", "cluster": cluster.slug}
    assert await communicator.receive_nothing(timeout=0.3)
    await communicator.disconnect()


@pytest.mark.asyncio
async def test_a_browser_hears_nothing_of_another_clusters_health(cluster, viewer):
    other = await database_sync_to_async(ClusterFactory)(name="other", slug="other")
    node = await database_sync_to_async(NodeFactory)(cluster=other)
    communicator = await browser(viewer, cluster.slug)

    await database_sync_to_async(record)(node)

    assert await communicator.receive_nothing(timeout=0.5)
    await communicator.disconnect()
