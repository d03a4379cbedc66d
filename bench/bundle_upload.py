"""The web process's memory while an agent uploads a 64 MiB diagnostic bundle.

    .venv/bin/python bench/bundle_upload.py [--mib 64] [--rounds 3] [--server daphne|uvicorn]

Embedded mode in a throwaway data directory: migrates, registers one node with a node token,
asks it for bundles, and starts daphne (clusterui.asgi, what `make demo` and production
run). Then, --rounds times: POSTs a bundle of about --mib MiB (random bytes, which gzip
cannot shrink, in a valid tar.gz) to /agent/bundles/<id>/ (after one of 1 MiB, so that what the first request imports is
not counted) as the agent does (streamed from a
file, Content-Length and X-Content-SHA256), sampling daphne's resident memory (VmRSS) every
20 ms. Also one upload of --mib + 1 MiB, over the largest bundle the server takes (refused
413 before its body is read). Prints, per upload: the answer, seconds, daphne's RSS before,
its peak during, and after.

Target (issue 26): memory stays flat: the peak during an upload is not the bundle's size
above the RSS before it (the body goes through the request's spool file and a temporary
file in 64 KiB chunks, never whole into memory).
"""

import argparse
import hashlib
import http.client
import io
import os
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


SERVERS = {
    "daphne": lambda port: ["daphne", "-e", f"tcp:port={port}:interface=127.0.0.1:backlog=4096",
                            "clusterui.asgi:application"],
    "uvicorn": lambda port: ["uvicorn", "--host", "127.0.0.1", "--port", str(port),
                             "--log-level", "warning", "clusterui.asgi:application"],
}


def setup(data_dir, max_bytes):
    os.environ.update(CLUSTERUI_MODE="embedded", CLUSTERUI_DATA_DIR=str(data_dir),
                      DJANGO_SETTINGS_MODULE="clusterui.settings",
                      CLUSTERUI_BUNDLE_MAX_BYTES=str(max_bytes))
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    from clusters.models import Cluster
    from nodes.services import do_issue_node_token, do_register_node

    cluster = Cluster.objects.create(name="bench", slug="bench")
    node = do_register_node(cluster, "gpu-001")
    return node, do_issue_node_token(node)[1]


def new_bundle_id(node):
    from nodes.bundles import do_request_bundle
    from nodes.models import AgentCommand

    bundle = do_request_bundle(node, reason="bench")
    # The bench plays the agent: the command is answered, so the next ask makes a new one.
    AgentCommand.objects.filter(pk=bundle.command_id).update(status="ok")
    return str(bundle.public_id)


def make_bundle(path, mib):
    with open(path, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz", compresslevel=1) as tar:
        manifest = b'{"node": "gpu-001", "files": [], "not_collected": []}'
        info = tarfile.TarInfo("gpu-001/manifest.json")
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest))
        data = os.urandom(mib * 1024 * 1024 - 64 * 1024)
        info = tarfile.TarInfo("gpu-001/nvidia-bug-report.log.gz")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def upload(port, bundle_id, path, token, pid):
    size = os.path.getsize(path)
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    samples, done = [rss_kib(pid)], threading.Event()

    def sample():
        while not done.is_set():
            samples.append(rss_kib(pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        with open(path, "rb") as body:
            connection.request("POST", f"/agent/bundles/{bundle_id}/", body=body, headers={
                "Authorization": f"Bearer {token}", "Content-Type": "application/gzip",
                "Content-Length": str(size), "X-Content-SHA256": digest})
            response = connection.getresponse()
            response.read()
            status = response.status
    except (BrokenPipeError, ConnectionResetError):
        status = "closed before the body was sent (answered first)"
    finally:
        connection.close()
    seconds = time.perf_counter() - started
    time.sleep(0.5)
    done.set()
    sampler.join()
    return status, seconds, samples[0], max(samples), rss_kib(pid), size


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--server", choices=SERVERS, default="daphne",
                        help="daphne (what the README runs) or uvicorn (bench/ingest's "
                             "requirements), serving the same clusterui.asgi:application")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="clusterui-bench-bundles.") as folder:
        folder = Path(folder)
        node, token = setup(folder / "data", args.mib * 1024 * 1024)
        port = free_port()
        log = open(folder / "daphne.log", "w")
        server = subprocess.Popen([sys.executable, "-m", *SERVERS[args.server](port)], cwd=REPO,
                                  env=os.environ.copy(), stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or server.poll() is not None:
                        raise SystemExit((folder / "daphne.log").read_text())
                    time.sleep(0.2)
            print(f"{args.server} pid {server.pid}, bundles of {args.mib} MiB")
            print("upload | answer | s | RSS before MiB | peak MiB | after MiB | peak - before")
            # A 1 MiB upload first: what the first request imports and opens is not the
            # body's cost.
            small = make_bundle(folder / "small.tar.gz", 1)
            report("1 MiB warm-up", upload(port, new_bundle_id(node), small, token, server.pid))
            path = make_bundle(folder / "bundle.tar.gz", args.mib)
            for n in range(args.rounds):
                report(f"{args.mib} MiB #{n + 1}",
                       upload(port, new_bundle_id(node), path, token, server.pid))
            over = make_bundle(folder / "over.tar.gz", args.mib + 1)
            report(f"{args.mib + 1} MiB (over)",
                   upload(port, new_bundle_id(node), over, token, server.pid))
        finally:
            server.terminate()
            server.wait(10)
            log.close()


def report(label, result):
    status, seconds, before, peak, after, size = result
    print(f"{label} | {status} | {seconds:.2f} | {before / 1024:.1f} | {peak / 1024:.1f} | "
          f"{after / 1024:.1f} | {(peak - before) / 1024:+.1f} MiB ({size / 2**20:.1f} MiB sent)")


if __name__ == "__main__":
    main()
