"""A join token cannot impersonate a node (issue 15, point 3; PROTOCOL.md): a join-token hello
naming an existing node is refused (4403, saying why) unless an admin opened that node, or
its whole cluster, to re-join; join tokens expire and may be single-use or for one node;
revoking a token or removing a node closes its live connection (4401)."""

from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.utils import timezone

from clusters.models import AuditEntry, Cluster
from nodes.live_store import MemoryLiveStore
from nodes.models import AgentToken, Node
from gateway.publisher import Publisher
from nodes.services import (
    do_issue_join_token,
    do_open_cluster_rejoin,
    do_open_rejoin,
    do_remove_node,
    do_revoke_agent_token,
)
from gateway.tests.test_consumers import closed_with, connect, event, hello, join, receive, send

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("in_memory_channel_layer")]

sync = database_sync_to_async


async def refused_hello(token, **fields):
    """The close code and the server's reason, for a hello that must be refused."""
    agent = await connect(token)
    await send(agent, hello(**fields))
    return await closed_with(agent)


async def the_node(name="gpu-001"):
    return await sync(Node.objects.select_related("cluster").get)(name=name)


async def push_the_change_feed():
    """What the publisher does every FEED_EVERY_S (it is off in these tests)."""
    await Publisher(store=MemoryLiveStore(), channel_layer=get_channel_layer()).push_changes()


async def test_a_join_token_hello_for_an_existing_node_is_refused_and_the_node_keeps_working(
        join_token, caplog):
    agent, welcome = await join(join_token)
    assert await refused_hello(join_token) == 4403
    assert "node gpu-001 exists and is not open to re-join" in caplog.text
    # The real node's connection and token are untouched.
    await send(agent, event())
    assert (await receive(agent))["type"] == "ack"
    await agent.disconnect()
    again, _ = await join(welcome["node_token"])
    await again.disconnect()
    assert not await sync(AuditEntry.objects.filter(action="node.rejoin").exists)()


async def test_an_admins_opening_lets_one_rejoin_through(join_token):
    first, welcome = await join(join_token)
    node = await the_node()
    await sync(do_open_rejoin)(node, by="ada", until=timezone.now() + timedelta(hours=1))
    second, rejoined = await join(join_token)
    assert await closed_with(first) == 4409  # the old connection is replaced
    assert rejoined["node_token"] != welcome["node_token"]
    [entry] = await sync(list)(AuditEntry.objects.filter(action="node.rejoin"))
    assert entry.changes["open"].startswith("opened by ada until")
    node = await the_node()
    assert node.rejoin_open_until is None  # one re-join per opening
    await second.disconnect()
    assert await refused_hello(join_token) == 4403


async def test_an_expired_opening_is_closed(join_token):
    agent, _ = await join(join_token)
    await agent.disconnect()
    await sync(do_open_rejoin)(await the_node(), by="ada",
                               until=timezone.now() - timedelta(seconds=1))
    assert await refused_hello(join_token) == 4403


async def test_a_cluster_opened_for_a_migration_lets_every_node_rejoin_until_it_closes(
        join_token, cluster, admin):
    for name in ("gpu-001", "gpu-002"):
        agent, _ = await join(join_token, node=name)
        await agent.disconnect()
    await sync(do_open_cluster_rejoin)(cluster, actor=admin,
                                       until=timezone.now() + timedelta(hours=1))
    for name in ("gpu-001", "gpu-002", "gpu-001"):  # the cluster's opening is not used up
        agent, _ = await join(join_token, node=name, boot_id="reinstalled")
        await agent.disconnect()
    await sync(Cluster.objects.filter(pk=cluster.pk).update)(
        rejoin_open_until=timezone.now() - timedelta(seconds=1))
    assert await refused_hello(join_token, node="gpu-002") == 4403


async def test_a_single_use_join_token_joins_one_node(cluster):
    _, plaintext = await sync(do_issue_join_token)(cluster, single_use=True)
    agent, _ = await join(plaintext, node="gpu-001")
    await agent.disconnect()
    assert await closed_with(await connect(plaintext)) == 4401  # spent


async def test_a_join_token_for_one_node_rejoins_only_that_node(join_token, cluster):
    agent, _ = await join(join_token, node="gpu-001")
    await agent.disconnect()
    node = await the_node()
    await sync(do_open_rejoin)(node, by="repair #7", until=timezone.now() + timedelta(hours=1))
    _, plaintext = await sync(do_issue_join_token)(cluster, single_use=True, for_node=node)
    assert await refused_hello(plaintext, node="gpu-002") == 4403
    assert not await sync(Node.objects.filter(name="gpu-002").exists)()
    agent, welcome = await join(plaintext, node="gpu-001")
    assert "node_token" in welcome
    await agent.disconnect()
    # A repair's opening lasts until the repair ends, not one re-join.
    assert (await the_node()).rejoin_opened_by == "repair #7"


async def test_a_join_token_expires_after_24_hours_unless_its_maker_said_otherwise(cluster):
    token, plaintext = await sync(do_issue_join_token)(cluster)
    assert abs((token.expires_at - timezone.now()) - timedelta(hours=24)) < timedelta(minutes=1)
    await sync(AgentToken.objects.filter(pk=token.pk).update)(
        expires_at=timezone.now() - timedelta(seconds=1))
    assert await closed_with(await connect(plaintext)) == 4401


async def test_revoking_a_node_token_closes_its_live_connection(join_token):
    agent, welcome = await join(join_token)
    token = await sync(AgentToken.objects.get)(kind="node")
    await sync(do_revoke_agent_token)(token)
    await push_the_change_feed()
    assert await closed_with(agent) == 4401


async def test_revoking_the_join_token_a_node_joined_with_leaves_the_node_connected(cluster):
    token, plaintext = await sync(do_issue_join_token)(cluster)
    agent, _ = await join(plaintext)
    await sync(do_revoke_agent_token)(token)
    await push_the_change_feed()
    await send(agent, event())  # the connection is the node token's since the welcome
    assert (await receive(agent))["type"] == "ack"
    await agent.disconnect()


async def test_removing_a_node_closes_its_connection_and_its_token_stops_working(
        join_token, admin):
    agent, welcome = await join(join_token)
    other, _ = await join(join_token, node="gpu-002")
    assert await sync(do_remove_node)(await the_node(), actor=admin, reason="decommissioned")
    await push_the_change_feed()
    assert await closed_with(agent) == 4401
    assert not await sync(Node.objects.filter(name="gpu-001").exists)()
    assert await closed_with(await connect(welcome["node_token"])) == 4401
    [entry] = await sync(list)(AuditEntry.objects.filter(action="node.remove"))
    assert entry.object_repr == "gpu-001" and entry.changes["reason"] == "decommissioned"
    await send(other, event())  # another node's connection is not touched
    assert (await receive(other))["type"] == "ack"
    await other.disconnect()


async def test_a_node_with_a_running_repair_is_not_removed(join_token, admin):
    agent, _ = await join(join_token)
    await agent.disconnect()
    await sync(Node.objects.filter(name="gpu-001").update)(running_repair="repair #3 (reboot)")
    assert not await sync(do_remove_node)(await the_node(), actor=admin, reason="x")
    assert await sync(Node.objects.filter(name="gpu-001").exists)()
