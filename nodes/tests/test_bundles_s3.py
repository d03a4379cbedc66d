"""Diagnostic bundles in an S3-compatible bucket (settings: CLUSTERUI_BUNDLE_S3_BUCKET; the
storage is django-storages' S3Storage), against moto's S3 server on loopback: an upload is
stored in the bucket, downloaded from it, and deleted from it after the retention."""

import hashlib
import socket
import subprocess
import sys
import time
from datetime import timedelta

import boto3
import pytest
from django.urls import reverse
from django.utils import timezone

from nodes.bundles import do_request_bundle, prune_bundles
from nodes.services import do_issue_node_token, do_register_node

from .test_bundles import a_bundle, upload

pytestmark = pytest.mark.django_db

BUCKET = "clusterui-bundles"
KEYS = {"aws_access_key_id": "clusterui-test", "aws_secret_access_key": "clusterui-test-secret"}


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    port = free_port()
    log = (tmp_path_factory.mktemp("moto") / "moto.log").open("w")
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                               "-p", str(port)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                pytest.fail("moto's S3 server did not start")
            time.sleep(0.1)
    yield url
    server.terminate()
    server.wait(10)
    log.close()


@pytest.fixture
def bucket(s3_server, settings):
    s3 = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1", **KEYS)
    s3.create_bucket(Bucket=BUCKET)
    settings.STORAGES = {**settings.STORAGES, "bundles": {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {"bucket_name": BUCKET, "endpoint_url": s3_server,
                    "region_name": "us-east-1", "access_key": KEYS["aws_access_key_id"],
                    "secret_key": KEYS["aws_secret_access_key"], "location": "bundles",
                    "file_overwrite": False, "default_acl": None}}}
    yield s3
    for item in s3.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        s3.delete_object(Bucket=BUCKET, Key=item["Key"])
    s3.delete_bucket(Bucket=BUCKET)


def keys(s3):
    return [item["Key"] for item in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]


def test_a_bundle_goes_to_the_bucket_comes_back_from_it_and_leaves_it(
        bucket, cluster, client, client_for, operator):
    node = do_register_node(cluster, "gpu-001")
    token = do_issue_node_token(node)[1]
    bundle = do_request_bundle(node, reason="before repair #12 (reboot)")
    body = a_bundle()

    assert upload(client, bundle.public_id, body, token).status_code == 201

    key = f"bundles/{cluster.slug}/gpu-001/{bundle.public_id}.tar.gz"
    assert keys(bucket) == [key]
    assert bucket.get_object(Bucket=BUCKET, Key=key)["Body"].read() == body
    response = client_for(operator).get(
        reverse("nodes:bundle_download", args=[cluster.slug, "gpu-001", bundle.public_id]))
    downloaded = b"".join(response.streaming_content)
    assert hashlib.sha256(downloaded).hexdigest() == hashlib.sha256(body).hexdigest()

    assert prune_bundles(now=timezone.now() + timedelta(days=91)) == 1
    assert keys(bucket) == []
