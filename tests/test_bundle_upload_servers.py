"""The agents' bundle uploads over real servers, in production mode: uvicorn, which the
README puts in front of /agent/bundles/, stores a bundle and answers an upload over the
largest bundle before a byte of its body is sent (bench/bundle_upload.py measures its memory
flat during a 64 MiB upload, where daphne holds the whole body); daphne answers the same
table (tests/test_repair_integration.py: the real agent's bundle over daphne)."""

import hashlib
import http.client
import socket

import pytest

from clusters.tests.factories import ClusterFactory
from nodes.bundles import do_request_bundle
from nodes.models import DiagnosticBundle
from nodes.services import do_issue_node_token, do_register_node
from nodes.tests.test_bundles import a_bundle

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

MAX_BYTES = 1024 * 1024


def post(server, bundle, body, token):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.request("POST", f"/agent/bundles/{bundle.public_id}/", body=body, headers={
            "Authorization": f"Bearer {token}", "Content-Type": "application/gzip",
            "X-Content-SHA256": hashlib.sha256(body).hexdigest()})
        return connection.getresponse().status
    finally:
        connection.close()


def test_uvicorn_stores_a_bundle_and_refuses_one_too_big_before_its_body(processes):
    node = do_register_node(ClusterFactory(slug="int-bundles"), "gpu-001")
    token = do_issue_node_token(node)[1]
    server = processes.uvicorn(CLUSTERUI_BUNDLE_MAX_BYTES=MAX_BYTES)
    bundle = do_request_bundle(node, reason="asked by a test")
    body = a_bundle()

    assert post(server, bundle, body, token) == 201
    assert post(server, bundle, body, token) == 200
    stored = DiagnosticBundle.objects.get(pk=bundle.pk)
    assert stored.status == "stored" and stored.sha256 == hashlib.sha256(body).hexdigest()

    # Headers only, announcing a body over the limit: the answer comes without it.
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as client:
        client.sendall((f"POST /agent/bundles/{bundle.public_id}/ HTTP/1.1\r\n"
                        f"Host: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
                        f"Content-Type: application/gzip\r\n"
                        f"Content-Length: {MAX_BYTES + 1}\r\n\r\n").encode())
        answer = client.recv(4096).decode()
    assert answer.startswith("HTTP/1.1 413 "), answer
