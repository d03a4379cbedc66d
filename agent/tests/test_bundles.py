"""The agent's `collect_bundle` (agent/work/bundles.py): its sources are real programs run
as the agent runs them, with fakes standing in at the point of use for journalctl,
nvidia-smi and nvidia-bug-report.sh (shapes: fixtures/bundle/README.md); the upload goes to
an HTTP server on loopback. tests/test_repair_integration.py has the real agent uploading
to daphne."""

import asyncio
import hashlib
import io
import json
import os
import stat
import tarfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agent.work.bundles import BundleCommand
from agent.work.commands import CommandFailed

FIXTURES = Path(__file__).parent / "fixtures" / "bundle"
SMI_XML = Path(__file__).parents[1] / "data" / "h200" / "nvidia-smi-q.xml"
NODE = "gpu-017"


def script(folder, name, body):
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@pytest.fixture
def fakes(tmp_path):
    """argv of each source: fakes printing what the real tools print."""
    return {
        "kernel": [script(tmp_path, "journalctl-k", f"cat {FIXTURES / 'kernel.log'}\n")],
        "kernel_fallback": [script(tmp_path, "dmesg", "exit 1\n")],
        "nvidia_smi": [script(tmp_path, "nvidia-smi", f"cat {SMI_XML}\n")],
        "slurmd": [script(tmp_path, "journalctl-u", f"cat {FIXTURES / 'slurmd.journal'}\n")],
        "bug_report": [script(tmp_path, "nvidia-bug-report.sh",
                              'while [ $# -gt 0 ]; do [ "$1" = --output-file ] && out=$2; '
                              'shift; done\necho "nvidia-bug-report.sh stand-in" | gzip > '
                              '"$out.gz"\n')],
    }


class FakeClient:
    """What BundleCommand takes from the agent's client."""

    def __init__(self, origin="http://127.0.0.1:9"):
        self.origin = origin

    def nvml_readings(self):
        return [{"index": 0, "uuid": "GPU-0", "temp_c": 41}]

    def events_since(self, seconds):
        return [{"type": "event", "signature": "xid:79", "gpu_uuid": "GPU-0"}]

    def upload_target(self):
        return self.origin, "node-token-x", None


def members(path):
    with tarfile.open(path, mode="r:gz") as tar:
        return {member.name: tar.extractfile(member).read() for member in tar}


def test_it_collects_every_source_under_the_node_s_folder(fakes):
    path, manifest = BundleCommand(NODE, commands=fakes).collect(
        FakeClient().nvml_readings(), FakeClient().events_since(3600), 64 * 2**20,
        deadline=time.monotonic() + 60)

    files = members(path)
    assert sorted(files) == sorted(f"{NODE}/{name}" for name in (
        "manifest.json", "kernel-gpu.log", "kernel-tail.log", "nvidia-smi-q.xml", "slurmd.log",
        "nvml.json", "agent-events.json", "nvidia-bug-report.log.gz"))
    gpu_lines = files[f"{NODE}/kernel-gpu.log"].decode().splitlines()
    assert len(gpu_lines) == 6  # NVRM, Xid, AER and mce lines; not ext4's or audit's
    assert any("): 79, " in line for line in gpu_lines)
    assert files[f"{NODE}/kernel-tail.log"] == (FIXTURES / "kernel.log").read_bytes()
    assert files[f"{NODE}/nvidia-smi-q.xml"] == SMI_XML.read_bytes()
    assert json.loads(files[f"{NODE}/agent-events.json"])[0]["signature"] == "xid:79"
    assert manifest["not_collected"] == []
    assert json.loads(files[f"{NODE}/manifest.json"]) == manifest
    assert {entry["file"]: entry["how"] for entry in manifest["files"]}["nvidia-smi-q.xml"] \
        == fakes["nvidia_smi"][0]


def test_what_cannot_be_collected_is_in_the_manifest_with_why(fakes, tmp_path):
    fakes["kernel"] = [script(tmp_path, "journalctl-none", "echo 'No journal files' >&2; exit 1\n")]
    fakes["kernel_fallback"] = [script(tmp_path, "dmesg-denied",
                                       "echo 'dmesg: read kernel buffer failed: Operation not "
                                       "permitted' >&2; exit 1\n")]
    fakes["slurmd"] = [str(tmp_path / "no-such-journalctl")]
    fakes["nvidia_smi"] = [script(tmp_path, "nvidia-smi-hangs", "sleep 30\n")]

    command = BundleCommand(NODE, commands=fakes, clock=lambda: 0.0)
    path, manifest = command.collect([], [], 64 * 2**20, deadline=2.0)

    why = {entry["file"]: entry["why"] for entry in manifest["not_collected"]}
    assert "Operation not permitted" in why["kernel-gpu.log"]
    assert why["slurmd.log"] == f"{tmp_path / 'no-such-journalctl'} is not on this node"
    assert why["nvidia-smi-q.xml"].endswith("did not finish within 2 s")
    assert why["nvidia-bug-report.log.gz"] == "skipped: 2 s left before the deadline"
    assert f"{NODE}/nvml.json" in members(path)


def test_a_bundle_over_max_bytes_leaves_its_largest_files_out(fakes, tmp_path):
    big = tmp_path / "big.log"
    big.write_bytes(os.urandom(1_000_000))  # 1 MB that gzip cannot shrink
    fakes["slurmd"] = [script(tmp_path, "journalctl-big", f"cat {big}\n")]

    path, manifest = BundleCommand(NODE, commands=fakes).collect([], [], 200_000,
                                                                 deadline=time.monotonic() + 60)

    assert Path(path).stat().st_size <= 200_000
    assert {"file": "slurmd.log", "why": "left out: the bundle was over 200000 bytes"} in \
        manifest["not_collected"]
    assert f"{NODE}/kernel-gpu.log" in members(path)


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.received.append((self.path, dict(self.headers), body))
        status = self.server.status
        answer = json.dumps({"status": status, "detail": "stored" if status == 201
                             else "over this bundle's max_bytes"}).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


@pytest.fixture
def receiver():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    server.received, server.status = [], 201
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def params(**more):
    return {"bundle_id": "b1", "upload_url": "/agent/bundles/b1/", "max_bytes": 2**20,
            "deadline_s": 60, **more}


def test_it_uploads_the_bundle_with_its_length_digest_and_the_node_token(fakes, receiver):
    client = FakeClient(f"http://127.0.0.1:{receiver.server_address[1]}")

    message = asyncio.run(BundleCommand(NODE, commands=fakes).run(
        "collect_bundle", params(), client))

    [(path, headers, body)] = receiver.received
    digest = hashlib.sha256(body).hexdigest()
    assert path == "/agent/bundles/b1/"
    assert headers["Authorization"] == "Bearer node-token-x"
    assert headers["Content-Type"] == "application/gzip"
    assert headers["X-Content-SHA256"] == digest
    assert int(headers["Content-Length"]) == len(body)
    assert message == f"bundle b1 uploaded: {len(body)} bytes, SHA-256 {digest}"
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        assert f"{NODE}/manifest.json" in tar.getnames()


def test_a_refused_upload_or_bad_params_fail_the_command_with_why(fakes, receiver):
    receiver.status = 413
    client = FakeClient(f"http://127.0.0.1:{receiver.server_address[1]}")
    command = BundleCommand(NODE, commands=fakes)

    with pytest.raises(CommandFailed, match="the upload was answered 413: over this bundle"):
        asyncio.run(command.run("collect_bundle", params(), client))
    with pytest.raises(CommandFailed, match="needs params.bundle_id and params.upload_url"):
        asyncio.run(command.run("collect_bundle", {"bundle_id": "b1"}, client))
    with pytest.raises(CommandFailed, match="cannot reach the server"):
        asyncio.run(command.run("collect_bundle", params(), FakeClient()))
