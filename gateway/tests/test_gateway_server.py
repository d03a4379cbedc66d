"""The agent gateway process's server (gateway/server.py) over real sockets, on uvloop as the
process serves (conftest.py): what it answers besides the agent socket, its own /metrics, and
a restart that closes every connection with 1012. (The protocol itself: test_consumers.py runs
every test against it too.)"""

import asyncio
import json
import urllib.error
import urllib.request

import pytest
import uvloop
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from gateway.server import run_gateway
from gateway.tests.test_consumers import hello

pytestmark = [pytest.mark.asyncio(loop_factories=["gateway"]),
              pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("in_memory_channel_layer")]


class Gateway:
    def __init__(self):
        self.stop = asyncio.Event()
        self.bound = asyncio.get_running_loop().create_future()
        self.task = asyncio.ensure_future(run_gateway("127.0.0.1", 0, ready=self.bound.set_result,
                                                      stop=self.stop))

    async def __aenter__(self):
        self.port = await asyncio.wait_for(self.bound, 10)
        self.http = f"http://127.0.0.1:{self.port}"
        self.ws = f"ws://127.0.0.1:{self.port}/ws/agent/"
        return self

    async def __aexit__(self, *exc):
        self.stop.set()
        await asyncio.wait_for(self.task, 10)


async def http_get(url, token=None):
    """(status, body) of a GET, from a worker thread (urllib blocks)."""
    def get():
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"}
                                         if token else {})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
    return await asyncio.to_thread(get)


async def test_it_answers_the_balancers_probe_and_no_other_page():
    async with Gateway() as gateway:
        assert await http_get(f"{gateway.http}/healthz") == (200, "ok\n")
        status, body = await http_get(f"{gateway.http}/clusters/")
        assert status == 404 and "/ws/agent/" in body


async def test_its_metrics_count_the_agents_it_serves_and_need_the_token(join_token,
                                                                         settings):
    settings.CLUSTERUI_METRICS_TOKEN = "scrape-me"

    async def scrape():
        status, text = await http_get(f"{gateway.http}/metrics", token="scrape-me")
        assert status == 200
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines() if line and not line.startswith("#")}

    async with Gateway() as gateway:
        assert (await http_get(f"{gateway.http}/metrics"))[0] == 401
        before = await scrape()
        async with connect(gateway.ws, additional_headers={
                "Authorization": f"Bearer {join_token}"}) as ws:
            await ws.send(json.dumps(hello()))
            assert json.loads(await ws.recv())["type"] == "welcome"
            assert json.loads(await ws.recv())["type"] == "config"  # the hello is done
            during = await scrape()
        await asyncio.sleep(0.2)  # the server sees the close
        after = await scrape()
    connected = "clusterui_gateway_agents_connected"
    assert during[connected] == before[connected] + 1 == after[connected] + 1
    assert during['clusterui_gateway_hellos_in_hand{path="full"}'] == 0
    assert "clusterui_gateway_event_ack_seconds_count" in during


async def test_a_restart_closes_every_agent_connection_with_1012(join_token):
    async with Gateway() as gateway:
        agents = []
        for n in range(3):
            ws = await connect(gateway.ws, additional_headers={
                "Authorization": f"Bearer {join_token}"})
            await ws.send(json.dumps(hello(node=f"gpu-{n:03d}")))
            assert json.loads(await ws.recv())["type"] == "welcome"
            agents.append(ws)
        gateway.stop.set()
        for ws in agents:
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    await asyncio.wait_for(ws.recv(), 10)
            assert closed.value.rcvd.code == 1012


async def test_these_tests_run_on_the_loop_the_gateway_process_serves_on(monkeypatch):
    from django.core.management import call_command

    from gateway.management.commands import agent_gateway

    assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
    loops = []

    async def serve(host, port):
        loops.append(type(asyncio.get_running_loop()))

    monkeypatch.setattr(agent_gateway, "run_gateway", serve)
    monkeypatch.setattr(agent_gateway.gc_tuning, "apply", lambda: None)
    await asyncio.to_thread(call_command, "agent_gateway", "--port", "0")
    assert loops == [uvloop.Loop]
