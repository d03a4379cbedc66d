"""The agent gateway's own server tests run on uvloop, the event loop its process serves on
(manage.py agent_gateway); the rest of gateway/tests on asyncio's, as daphne's Twisted
reactor runs the agent socket in embedded mode."""

import asyncio

import uvloop

ON_THE_GATEWAYS_LOOP = {"test_gateway_server.py"}


def pytest_asyncio_loop_factories(config, item):
    if item.path.name in ON_THE_GATEWAYS_LOOP:
        return {"uvloop": uvloop.new_event_loop}
    return {"asyncio": asyncio.new_event_loop}
