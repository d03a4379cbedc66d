"""A fleet's WebSocket upgrades and a person's page on one real daphne
(gateway/daphne_upgrades.py): the upgrades sent at once wait for turns of its loop, the page
asked meanwhile is answered, and every agent is upgraded in the end, those that left while
waiting aside. That the page goes between two turns' upgrades is shown on a real loop in
gateway/tests/test_daphne_upgrades.py: here, how far the upgrades got when the page is
answered depends on the machine's speed."""

import socket

import pytest

from .integration import AGENT_UPGRADE_WITH_A_BAD_TOKEN, parse_metrics

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

METRICS_TOKEN = "integration-metrics-token"
AGENTS = 300
LEAVING = 10


def status_line(sock):
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.partition(b"\r\n")[0]


def metric(server, name):
    status, body = server.get("/metrics", token=METRICS_TOKEN, timeout=30)
    assert status == 200, body
    values = [value for series, _, value in parse_metrics(body) if series == name]
    assert len(values) == 1, (name, values)
    return values[0]


def test_agents_upgrades_at_once_wait_their_turns_a_page_is_answered_and_every_agent_is_upgraded(
        processes):
    server = processes.daphne(CLUSTERUI_METRICS_TOKEN=METRICS_TOKEN)
    sockets = []
    try:
        for _ in range(AGENTS):
            sockets.append(socket.create_connection(("127.0.0.1", int(server.port)), timeout=60))
        for sock in sockets:  # at once, as a fleet powering on
            sock.sendall(AGENT_UPGRADE_WITH_A_BAD_TOKEN)
        for sock in sockets[-LEAVING:]:
            sock.close()

        metric(server, "clusterui_gateway_agent_upgrades_waiting")  # a page, answered

        # Each is upgraded, then closed for its token (PROTOCOL.md: 4401).
        assert {status_line(sock) for sock in sockets[:-LEAVING]} == {
            b"HTTP/1.1 101 Switching Protocols"}
    finally:
        for sock in sockets:
            sock.close()
    # Two are upgraded a turn and the rest of those read together wait: most of the 300;
    # without daphne_upgrades, none.
    assert metric(server, "clusterui_gateway_agent_upgrades_waited_total") >= AGENTS // 4
    assert metric(server, "clusterui_gateway_agent_upgrades_waiting") == 0
    status, _ = server.get("/healthz")
    assert status == 200
    assert "Traceback" not in server.log_text()
