"""Live updates of the Health checks tab: the services append a change row in their
transaction; the publisher, reading the change feed, sends "health.changed" to the cluster's
group once per read however many rows, and the browsers' live socket passes it on."""

import asyncio
import json

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.db import transaction
from django.test import Client

from clusterui.asgi import application
from clusters.tests.factories import ClusterFactory
from common.groups import cluster_group
from healthchecks.services import (
    do_acknowledge_event,
    do_close_health_event,
    do_record_health_event,
    do_resolve_event,
)
from gateway.publisher import Publisher
from nodes.tests.factories import NodeFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def channel_layer_in_memory(in_memory_channel_layer):
    """Every test here runs on the in-memory channel layer (the root conftest's fixture)."""


async def publish():
    """One read of the change feed by the publisher (in a server process, every 200 ms)."""
    await Publisher().push_changes()


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
    assert await received(channel) == []  # the service only wrote its change row
    await publish()

    assert await received(channel) == [{"type": "health.changed", "cluster": cluster.slug}]
    await publish()  # read once: not again
    assert await received(channel) == []


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
    await publish()
    assert await received(channel) == []


@pytest.mark.asyncio
@pytest.mark.parametrize("change", ["acknowledge", "close", "resolve"])
async def test_acknowledging_closing_and_resolving_are_announced(cluster, operator, change):
    node = await database_sync_to_async(NodeFactory)(cluster=cluster)
    event = await database_sync_to_async(record)(node)
    await publish()  # the opening, read before the change under test
    channel = await listen(cluster_group(cluster.slug))

    def act():
        if change == "acknowledge":
            return do_acknowledge_event(event, actor=operator)
        if change == "close":
            return do_close_health_event(event, reason="cleared by the agent")
        return do_resolve_event(event, actor=operator, comment="reseated the GPU")

    assert await database_sync_to_async(act)()
    await publish()
    assert await received(channel) == [{"type": "health.changed", "cluster": cluster.slug}]
    # Done already: nothing changed, nothing is announced.
    assert not await database_sync_to_async(act)()
    await publish()
    assert await received(channel) == []


@pytest.mark.asyncio
async def test_a_storm_is_one_message_per_cluster_per_read(cluster):
    node = await database_sync_to_async(NodeFactory)(cluster=cluster)
    other = await database_sync_to_async(ClusterFactory)(name="other", slug="other")
    other_node = await database_sync_to_async(NodeFactory)(cluster=other)
    channel = await listen(cluster_group(cluster.slug))
    other_channel = await listen(cluster_group(other.slug))

    for _ in range(100):  # an Xid storm the agent did not coalesce: one frame per line
        await database_sync_to_async(record)(node)
    await database_sync_to_async(record)(other_node)
    await publish()

    assert await received(channel) == [{"type": "health.changed", "cluster": cluster.slug}]
    # Another cluster hears of its own change, and only of it.
    assert await received(other_channel) == [{"type": "health.changed", "cluster": "other"}]
    # The counts that came after the read are not lost: the next read carries them.
    await database_sync_to_async(record)(node)
    await publish()
    assert await received(channel) == [{"type": "health.changed", "cluster": cluster.slug}]


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
    await publish()

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
    await publish()

    assert await communicator.receive_nothing(timeout=0.5)
    await communicator.disconnect()
