"""Diagnostic bundles on the server (nodes/bundles.py, gateway/bundle_upload.py): asking a
node for one, PROTOCOL.md's answers to every upload (hostile ones store nothing), the
listing that refuses a gzip bomb, the download (operators, audited) and the retention.
tests/test_bundles_integration.py has the real agent over daphne; test_bundles_s3.py the
bucket."""

import asyncio
import hashlib
import io
import json
import tarfile
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from clusters.models import AuditEntry
from gateway.bundle_upload import UploadSizeGuard
from nodes.bundles import do_request_bundle, prune_bundles, settle
from nodes.models import AgentCommand, DiagnosticBundle
from nodes.services import do_issue_node_token, do_register_node, do_revoke_agent_token

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def bundle_storage(settings, tmp_path):
    settings.STORAGES = {**settings.STORAGES, "bundles": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(tmp_path / "bundles")}}}
    return tmp_path / "bundles"


def stored_files(folder):
    return sorted(path.name for path in folder.rglob("*") if path.is_file())


def tar_gz(entries):
    """A gzip-compressed tar of {name: bytes}."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


def a_bundle(node_name="gpu-001", **more):
    return tar_gz({f"{node_name}/manifest.json": b'{"files": []}',
                   f"{node_name}/kernel-gpu.log":
                       b"NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.\n", **more})


@pytest.fixture
def node(cluster):
    return do_register_node(cluster, "gpu-001")


@pytest.fixture
def token(node):
    return do_issue_node_token(node)[1]


@pytest.fixture
def bundle(node):
    return do_request_bundle(node, reason="before repair #12 (reboot)")


def upload(client, bundle_id, body, token, digest=None):
    return client.generic(
        "POST", reverse("agent_bundle_upload", args=[bundle_id]), data=body,
        content_type="application/gzip", HTTP_AUTHORIZATION=f"Bearer {token}",
        HTTP_X_CONTENT_SHA256=digest or hashlib.sha256(body).hexdigest())


def test_asking_sends_the_agent_a_collect_bundle_command_once(node, bundle, settings):
    command = bundle.command
    assert (command.action, command.status) == ("collect_bundle", "queued")
    assert command.params == {"bundle_id": str(bundle.public_id),
                              "upload_url": f"/agent/bundles/{bundle.public_id}/",
                              "max_bytes": settings.CLUSTERUI_BUNDLE_MAX_BYTES,
                              "deadline_s": settings.CLUSTERUI_BUNDLE_DEADLINE_S}
    # Asked again while the agent collects it: the same bundle, no second command.
    assert do_request_bundle(node, reason="again") == bundle
    assert AgentCommand.objects.filter(action="collect_bundle").count() == 1


def test_a_bundle_is_stored_listed_and_a_second_upload_of_it_changes_nothing(
        client, bundle, token, bundle_storage):
    body = a_bundle()

    first = upload(client, bundle.public_id, body, token)
    again = upload(client, bundle.public_id, body, token)
    other = upload(client, bundle.public_id, a_bundle(**{"gpu-001/x.txt": b"other"}), token)

    assert (first.status_code, again.status_code, other.status_code) == (201, 200, 409)
    bundle.refresh_from_db()
    assert bundle.status == "stored" and bundle.size_bytes == len(body)
    assert bundle.sha256 == hashlib.sha256(body).hexdigest()
    assert [entry["name"] for entry in bundle.listing] == ["gpu-001/manifest.json",
                                                            "gpu-001/kernel-gpu.log"]
    assert stored_files(bundle_storage) == [f"{bundle.public_id}.tar.gz"]
    assert (bundle_storage / bundle.stored_as).read_bytes() == body


def bomb():
    """50 MiB of zeros in one file: about 50 KiB compressed."""
    return a_bundle(**{"gpu-001/zeros.bin": bytes(50 * 1024 * 1024)})


@pytest.mark.parametrize("case, status", [
    ("no token", 401), ("another node's token", 403), ("a revoked token", 401),
    ("an id never asked", 404), ("over max_bytes", 413), ("a wrong digest", 422),
    ("a gzip bomb", 422), ("not a tar file", 422), ("a path outside the node", 422),
    ("a link", 422), ("no manifest", 422), ("65 files", 422),
])
def test_a_hostile_upload_gets_its_answer_and_nothing_is_stored(
        client, cluster, node, bundle, token, bundle_storage, settings, case, status):
    settings.CLUSTERUI_BUNDLE_MAX_UNPACKED_BYTES = 8 * 1024 * 1024
    body, bundle_id, given_token, digest = a_bundle(), bundle.public_id, token, None
    if case == "no token":
        given_token = ""
    elif case == "another node's token":
        given_token = do_issue_node_token(do_register_node(cluster, "gpu-002"))[1]
    elif case == "a revoked token":
        do_revoke_agent_token(node.agent_tokens.get())
    elif case == "an id never asked":
        bundle_id = "6f1c3d2e-8a4b-5c6d-9e7f-0a1b2c3d4e5f"
    elif case == "over max_bytes":
        DiagnosticBundle.objects.filter(pk=bundle.pk).update(max_bytes=len(body) - 1)
    elif case == "a wrong digest":
        digest = hashlib.sha256(b"something else").hexdigest()
    elif case == "a gzip bomb":
        body = bomb()
    elif case == "not a tar file":
        body = b"\x1f\x8b" + bytes(100)
    elif case == "a path outside the node":
        body = a_bundle(**{"gpu-001/../../etc/cron.d/x": b"* * * * * root sh"})
    elif case == "a link":
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w:gz") as tar:
            tar.addfile(tarfile.TarInfo("gpu-001/manifest.json"), io.BytesIO(b""))
            link = tarfile.TarInfo("gpu-001/shadow")
            link.type, link.linkname = tarfile.SYMTYPE, "/etc/shadow"
            tar.addfile(link)
        body = raw.getvalue()
    elif case == "no manifest":
        body = tar_gz({"gpu-001/kernel-gpu.log": b"x"})
    elif case == "65 files":
        body = a_bundle(**{f"gpu-001/{n}.log": b"x" for n in range(64)})

    response = upload(client, bundle_id, body, given_token, digest)

    assert response.status_code == status, response.json()
    assert response.json()["detail"]
    assert stored_files(bundle_storage) == []
    bundle.refresh_from_db()
    assert bundle.status == "requested" and not bundle.sha256


def test_the_listing_stops_at_the_bomb_s_header_without_expanding_it(settings, node):
    from nodes.bundles import BundleRefused, list_bundle

    settings.CLUSTERUI_BUNDLE_MAX_UNPACKED_BYTES = 1024 * 1024
    body = bomb()
    reads = []

    class Counting(io.BytesIO):
        def read(self, size=-1):
            data = super().read(size)
            reads.append(len(data))
            return data

    with pytest.raises(BundleRefused, match="unpacks to more than 1048576 bytes"):
        list_bundle(Counting(body), "gpu-001")
    assert sum(reads) < len(body)  # refused before the 50 MiB were inflated


def test_the_guard_answers_before_django_reads_a_body(settings):
    settings.CLUSTERUI_BUNDLE_MAX_BYTES = 1000
    sent = []

    async def app(scope, receive, send):
        sent.append("django")

    async def send(message):
        sent.append(message)

    async def call(headers):
        sent.clear()
        scope = {"type": "http", "path": "/agent/bundles/x/", "headers": headers}
        await UploadSizeGuard(app)(scope, None, send)
        return sent[0] if sent[0] == "django" else sent[0]["status"]

    assert asyncio.run(call([])) == 411
    assert asyncio.run(call([(b"content-length", b"1001")])) == 413
    assert asyncio.run(call([(b"content-length", b"1000")])) == "django"


def test_a_bundle_whose_agent_fails_or_never_answers_is_settled_with_why(node):
    failed = do_request_bundle(node, reason="x")
    AgentCommand.objects.filter(pk=failed.command_id).update(status="failed",
                                                              message="disk full")
    assert settle(failed).status == "failed"
    assert failed.message == "the agent's answer: failed: disk full"

    silent = do_request_bundle(node, reason="y")
    assert settle(silent).status == "requested"
    later = silent.requested_at + timedelta(seconds=silent.deadline_s + 1)
    assert settle(silent, now=later).message == f"the agent sent none within {silent.deadline_s} s"


def test_operators_download_it_audited_and_viewers_see_it(
        client_for, operator, viewer, node, bundle, token, client):
    body = a_bundle()
    upload(client, bundle.public_id, body, token)
    bundle.refresh_from_db()
    page = reverse("nodes:detail", args=[node.cluster.slug, node.name])
    download = reverse("nodes:bundle_download",
                       args=[node.cluster.slug, node.name, bundle.public_id])

    seen = client_for(viewer).get(page).text
    assert bundle.sha256[:16] in seen and download not in seen
    assert client_for(viewer).get(download).status_code == 403
    response = client_for(operator).get(download)

    assert response.status_code == 200
    assert b"".join(response.streaming_content) == body
    assert response["Content-Disposition"].startswith('attachment; filename="gpu-001-')
    entry = AuditEntry.objects.get(action="diagnosticbundle.download")
    assert entry.actor == operator and entry.changes["sha256"] == bundle.sha256


def test_an_operator_asks_a_node_for_a_bundle_from_its_page(client_for, operator, node):
    response = client_for(operator).post(
        reverse("nodes:bundle_request", args=[node.cluster.slug, node.name]))

    assert response.status_code == 302
    bundle = DiagnosticBundle.objects.get(node=node)
    assert bundle.reason == "asked by alice" and bundle.requested_by == operator
    assert AuditEntry.objects.get(action="agentcommand.send").changes["action"] == \
        "collect_bundle"


def test_bundles_past_their_retention_are_deleted_and_the_row_says_so(
        client, bundle, token, bundle_storage, settings):
    upload(client, bundle.public_id, a_bundle(), token)
    settings.CLUSTERUI_BUNDLE_RETENTION_DAYS = 90

    assert prune_bundles(now=timezone.now() + timedelta(days=89)) == 0
    assert prune_bundles(now=timezone.now() + timedelta(days=91)) == 1

    bundle.refresh_from_db()
    assert bundle.status == "expired" and bundle.sha256 and stored_files(bundle_storage) == []
    assert json.loads(json.dumps(bundle.listing))  # what it held stays listed
