"""Real receivers on loopback for the notification tests: an HTTP server that records every
POST (and answers with the status codes it is told to), and an SMTP server (aiosmtpd)."""

import socket
import threading
from email import message_from_bytes, policy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from aiosmtpd.controller import Controller


class HttpReceiver:
    def __init__(self):
        self.requests = []  # (path, headers as a dict, body bytes)
        self.statuses = []  # answered in order; 200 once they run out
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver._lock:
                    receiver.requests.append((self.path, dict(self.headers), body))
                    status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"receiver says no" if status >= 400 else b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def url(self, path="/hook"):
        return f"http://127.0.0.1:{self.port}{path}"

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


class SmtpReceiver:
    def __init__(self):
        self.messages = []  # email.message.EmailMessage
        receiver = self

        class Handler:
            async def handle_DATA(self, server, session, envelope):
                receiver.messages.append(message_from_bytes(envelope.content,
                                                            policy=policy.default))
                return "250 OK"

        with socket.socket() as probe:  # aiosmtpd wants a port it can connect to itself
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port)

    def url(self, to="oncall@example.com"):
        return (f"mailto://127.0.0.1:{self.port}?mode=insecure&from=clusterui@example.com"
                f"&to={to}")

    def start(self):
        self.controller.start()
        return self

    def stop(self):
        self.controller.stop()


@pytest.fixture
def http_receiver():
    receiver = HttpReceiver().start()
    yield receiver
    receiver.stop()


@pytest.fixture
def smtp_receiver():
    receiver = SmtpReceiver().start()
    yield receiver
    receiver.stop()
