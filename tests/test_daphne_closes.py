"""A WebSocket close from a real daphne reaches an agent that does not answer it
(gateway/daphne_closes.py): the 101, then the close frame with its code, and only seconds
later the server drops the connection. autobahn's own timeout (1 s, rounded down to a whole
second by txaio) dropped it within a second, and on a busy loop before the close frame was
written."""

import socket
import struct
import time

import pytest

from .integration import AGENT_UPGRADE_WITH_A_BAD_TOKEN

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def read_upgrade_and_close_frame(sock):
    """(status line, close code) of the server's answer: its 101 and the close frame after it."""
    data = b""
    while True:
        head, _, frames = data.partition(b"\r\n\r\n")
        if frames[2:] and len(frames) >= 2 + (frames[1] & 0x7F):
            break
        chunk = sock.recv(4096)
        assert chunk, f"the server closed the connection after {data!r}"
        data += chunk
    assert frames[0] == 0x88, frames  # a final close frame, unmasked
    return head.partition(b"\r\n")[0], struct.unpack("!H", frames[2:4])[0]


def seconds_until_dropped(sock):
    start = time.monotonic()
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:  # autobahn drops with a reset
        pass
    return time.monotonic() - start


def test_a_close_frame_reaches_an_agent_that_does_not_answer_it_and_it_is_dropped_seconds_later(
        processes):
    server = processes.daphne()
    with socket.create_connection(("127.0.0.1", int(server.port)), timeout=30) as sock:
        sock.sendall(AGENT_UPGRADE_WITH_A_BAD_TOKEN)
        status_line, code = read_upgrade_and_close_frame(sock)
        held_s = seconds_until_dropped(sock)

    assert status_line == b"HTTP/1.1 101 Switching Protocols"
    assert code == 4401  # its token no longer works (PROTOCOL.md)
    # daphne_closes.CLOSE_HANDSHAKE_TIMEOUT_S, rounded down by txaio to 4-5 s; 0-1 s before.
    assert 3.0 <= held_s <= 10.0, held_s
