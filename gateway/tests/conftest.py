"""Each server of the agent socket is tested on the event loop it serves on: daphne on
asyncio's own (embedded mode), the agent gateway process on uvloop (manage.py
agent_gateway). A test module picks them by name with pytest.mark.asyncio(loop_factories=):
test_consumers.py runs every test on both, `channels` (AgentConsumer through Channels'
communicator, as daphne serves it) and `gateway` (the gateway's server over a real
socket); test_gateway_server.py on `gateway`. The rest of gateway/tests runs on asyncio's
loop."""

import asyncio

import uvloop

SERVERS = {"channels": asyncio.new_event_loop, "gateway": uvloop.new_event_loop}
PICKS_A_SERVER = {"test_consumers.py", "test_gateway_server.py"}


def pytest_asyncio_loop_factories(config, item):
    if item.path.name in PICKS_A_SERVER:
        return SERVERS
    return {"asyncio": asyncio.new_event_loop}
