"""Each server of the agent socket is tested on the event loop it serves on: daphne on
asyncio's own (embedded mode), the agent gateway process on uvloop (manage.py
agent_gateway). test_consumers.py runs every test on both, named after the server:
`channels` (AgentConsumer through Channels' communicator, as daphne serves it) and
`gateway` (the gateway's server over a real socket). test_gateway_server.py runs on uvloop,
the rest of gateway/tests on asyncio's loop."""

import asyncio

import uvloop

BOTH_SERVERS = {"channels": asyncio.new_event_loop, "gateway": uvloop.new_event_loop}


def pytest_asyncio_loop_factories(config, item):
    if item.path.name == "test_consumers.py":
        return BOTH_SERVERS
    if item.path.name == "test_gateway_server.py":
        return {"gateway": uvloop.new_event_loop}
    return {"asyncio": asyncio.new_event_loop}
