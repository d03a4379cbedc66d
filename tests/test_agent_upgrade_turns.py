"""A fleet's WebSocket upgrades and a person's page on one daphne (gateway/daphne_upgrades.py):
the page is answered while the agents' upgrades still wait their turn, and every agent is
upgraded in the end, those that left while waiting aside."""

import socket

import pytest

from .integration import parse_metrics

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

METRICS_TOKEN = "integration-metrics-token"
AGENTS = 300
LEAVING = 10
UPGRADE = (b"GET /ws/agent/ HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
           b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
           b"Sec-WebSocket-Version: 13\r\nAuthorization: Bearer not-a-token\r\n\r\n")


def status_line(sock):
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.partition(b"\r\n")[0]


def test_a_page_is_answered_while_agents_upgrades_wait_and_every_agent_is_upgraded(processes):
    server = processes.daphne(CLUSTERUI_METRICS_TOKEN=METRICS_TOKEN)
    sockets = []
    try:
        for _ in range(AGENTS):
            sockets.append(socket.create_connection(("127.0.0.1", int(server.port)), timeout=60))
        for sock in sockets:  # at once, as a fleet powering on
            sock.sendall(UPGRADE)
        for sock in sockets[-LEAVING:]:
            sock.close()

        status, body = server.get("/metrics", token=METRICS_TOKEN, timeout=30)
        assert status == 200, body
        waiting = [value for name, _, value in parse_metrics(body)
                   if name == "clusterui_gateway_agent_upgrades_waiting"]
        assert waiting and waiting[0] > 0, waiting

        # Each is upgraded, then closed for its token (PROTOCOL.md: 4401).
        assert {status_line(sock) for sock in sockets[:-LEAVING]} == {
            b"HTTP/1.1 101 Switching Protocols"}
    finally:
        for sock in sockets:
            sock.close()
    status, _ = server.get("/healthz")
    assert status == 200
    assert "Traceback" not in server.log_text()
