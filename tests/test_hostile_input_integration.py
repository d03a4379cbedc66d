"""Hostile input over real sockets (issue 15): daphne with its publisher on Redis, the real
agent, PostgreSQL. A hostile frame is answered and the node stays served; a join token does
not take over a live node; revoking a node's token closes its agent's live connection
(4401) through the change feed; a flood is rate limited without touching other nodes."""

import asyncio
import json
import uuid

import pytest
import websockets

from clusters.tests.factories import ClusterFactory
from nodes.models import AgentToken, Node
from nodes.services import do_issue_join_token, do_revoke_agent_token

from .integration import agent_url, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def event(**fields):
    return {"type": "event", "id": str(uuid.uuid4()), "ts": 1764442001.5,
            "signature": "thermal_throttle", "severity": "warning", "message": "hot", **fields}


async def say_hello(ws, node):
    await ws.send(json.dumps({"type": "hello", "node": node, "boot_id": "b1",
                              "agent_version": "test", "gpus": []}))
    welcome = json.loads(await ws.recv())
    assert welcome["type"] == "welcome", welcome
    assert json.loads(await ws.recv())["type"] == "config"
    return welcome


async def answers_until_ack(ws, event_id):
    seen = []
    while True:
        frame = json.loads(await asyncio.wait_for(ws.recv(), 10))
        if frame.get("type") == "ack" and event_id in frame["ids"]:
            return seen
        seen.append(frame)


def test_over_real_sockets_hostile_frames_are_answered_and_a_flood_is_limited(processes):
    processes.env.update(CLUSTERUI_AGENT_FRAMES_PER_S="5", CLUSTERUI_AGENT_FRAME_BURST="10")
    cluster = ClusterFactory(name="int-hostile", slug="int-hostile")
    _, join_token = do_issue_join_token(cluster)
    server = processes.daphne()
    url = agent_url(server.url)

    async def scenario():
        headers = {"Authorization": f"Bearer {join_token}"}
        async with websockets.connect(url, additional_headers=headers) as ws:
            await say_hello(ws, "gpu-hostile")
            hostile = event(signature="xid:\u0667\u0669", message="a\u0000b")
            await ws.send(json.dumps(hostile))
            await ws.send(json.dumps(event(count=2 ** 31)))
            probe = event()
            await ws.send(json.dumps(probe))
            seen = await answers_until_ack(ws, probe["id"])
            assert [(f["code"], f.get("id")) for f in seen][0] == ("bad_message", hostile["id"])
            assert all(f["code"] == "bad_message" for f in seen) and len(seen) == 2
            flood = [event(signature=f"sig_{i}") for i in range(40)]
            for frame in flood:
                await ws.send(json.dumps(frame))
            answers = [json.loads(await asyncio.wait_for(ws.recv(), 10)) for _ in flood]
            limited = [f for f in answers if f.get("code") == "rate_limited"]
            assert limited and all(f["retry_id"] in {e["id"] for e in flood} for f in limited)
            assert ws.close_code is None  # rate limits are no bad frames: still open

    asyncio.run(scenario())
    server.check_running()
    assert "Traceback" not in server.log_text()


def test_a_join_token_cannot_take_over_a_node_and_a_revoked_token_closes_its_agent(processes):
    cluster = ClusterFactory(name="int-revoke", slug="int-revoke")
    _, join_token = do_issue_join_token(cluster)
    server = processes.daphne()
    agent = processes.agent("gpu-victim", server, token=join_token)
    # The server records the hello before the agent reads its welcome and logs it: wait for both.
    node = wait_until(lambda: agent.check_running() or (
        agent.connections_opened() >= 1 and Node.objects.filter(
            cluster=cluster, name="gpu-victim", last_hello_at__isnull=False).first()),
        timeout=30, what="the agent joins")

    async def impersonate():
        async with websockets.connect(
                agent_url(server.url), additional_headers={"Authorization": f"Bearer {join_token}"}) as ws:
            await ws.send(json.dumps({"type": "hello", "node": "gpu-victim", "boot_id": "evil",
                                      "agent_version": "evil", "gpus": []}))
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 10)
            return ws.close_code, ws.close_reason

    code, _ = asyncio.run(impersonate())
    assert code == 4403
    assert Node.objects.get(pk=node.pk).boot_id != "evil"
    assert agent.connections_opened() == 1  # the real agent was not touched

    token = AgentToken.objects.get(node=node, revoked_at__isnull=True)
    do_revoke_agent_token(token)
    wait_until(lambda: agent.check_running() or "4401" in agent.log_text()
               or "refused the stored node token" in agent.log_text(),
               timeout=20, what="the revoked token's live connection is closed")
