"""The server's `collect_bundle` command (shared/PROTOCOL.md "Diagnostic bundles"): what an
engineer, or NVIDIA's support, needs to find out why a GPU failed, collected before a repair
wipes it, as one gzip-compressed tar file under a folder named after the node, uploaded to
the console.

    <node>/manifest.json          each file: what it is, how it was made, its size; and what
                                  could not be collected, and why
    <node>/kernel-gpu.log         the kernel log since boot, its NVRM, Xid, SXid, PCIe/AER
                                  and machine-check lines (journalctl -k -b; dmesg without
                                  systemd)
    <node>/kernel-tail.log        the kernel log's last 2,000 lines, unfiltered
    <node>/nvidia-smi-q.xml       nvidia-smi -q -x
    <node>/nvml.json              the agent's NVML readings at collection time
    <node>/agent-events.json      the events the agent raised in the last hour
    <node>/slurmd.log             slurmd's journal, its last 1,000 lines
    <node>/nvidia-bug-report.log.gz   nvidia-bug-report.sh's report, where the node has it

Every source has a time limit inside the command's deadline_s (the bug report gets at most
half of what is left, and none under BUG_REPORT_MIN_S), and a size limit. A bundle over
max_bytes leaves its largest files out (the manifest says so). At deadline_s the agent
gives up and answers `failed` with what it had.
"""

import asyncio
import hashlib
import http.client
import io
import json
import logging
import os
import re
import subprocess
import tarfile
import tempfile
import time
from urllib.parse import urlsplit

from .commands import CommandFailed

log = logging.getLogger(__name__)

# The kernel log's lines that say what happened to a GPU: the driver (NVRM, Xid), NVSwitch
# (SXid), PCIe and its error reporting (AER), and the CPU's machine checks (MCE).
GPU_LINES = re.compile(r"NVRM|Xid|SXid|PCIe|pcieport|AER|\bmce\b|Machine check|Hardware Error",
                       re.IGNORECASE)
KERNEL_TAIL_LINES = 2000
SLURMD_LINES = 1000
EVENTS_WINDOW_S = 3600
SOURCE_TIMEOUT_S = 20
BUG_REPORT_MIN_S = 20
BUG_REPORT_MAX_S = 90
FILE_LIMIT_BYTES = 32 * 1024 * 1024  # any one source, before compression
UPLOAD_TIMEOUT_S = 60

DEFAULT_COMMANDS = {
    "kernel": ["journalctl", "-k", "-b", "--no-pager", "-o", "short-iso"],
    "kernel_fallback": ["dmesg", "--time-format", "iso"],
    "nvidia_smi": ["nvidia-smi", "-q", "-x"],
    "slurmd": ["journalctl", "-u", "slurmd", "-n", str(SLURMD_LINES), "--no-pager",
               "-o", "short-iso"],
    "bug_report": ["nvidia-bug-report.sh"],
}


class BundleCommand:
    """Carries out `collect_bundle`: collect(), then upload. commands: the argv of each
    source (DEFAULT_COMMANDS; tests point them at fakes)."""

    actions = ("collect_bundle",)

    def __init__(self, node_name, *, commands=None, clock=time.monotonic):
        self.node_name = node_name
        self.commands = {**DEFAULT_COMMANDS, **(commands or {})}
        self._clock = clock

    async def run(self, action, params, client):
        bundle_id = params.get("bundle_id")
        upload_path = params.get("upload_url")
        if not isinstance(bundle_id, str) or not isinstance(upload_path, str) \
                or not upload_path.startswith("/"):
            raise CommandFailed("collect_bundle needs params.bundle_id and params.upload_url")
        max_bytes = _positive(params.get("max_bytes"), 64 * 1024 * 1024)
        deadline_s = _positive(params.get("deadline_s"), 120)
        deadline = self._clock() + deadline_s
        readings = client.nvml_readings()
        events = client.events_since(EVENTS_WINDOW_S)
        try:
            path, manifest = await asyncio.wait_for(asyncio.to_thread(
                self.collect, readings, events, max_bytes, deadline), timeout=deadline_s)
        except asyncio.TimeoutError:
            raise CommandFailed(f"collecting took longer than {deadline_s} s") from None
        try:
            left = max(deadline - self._clock(), 5)
            origin, token, tls = client.upload_target()
            status, detail, size, digest = await asyncio.to_thread(
                upload, path, origin + upload_path, token, tls, min(left, UPLOAD_TIMEOUT_S))
        finally:
            os.unlink(path)
        missing = [entry["file"] for entry in manifest["not_collected"]]
        if status not in (200, 201):
            raise CommandFailed(f"the upload was answered {status}: {detail}")
        return (f"bundle {bundle_id} uploaded: {size} bytes, SHA-256 {digest}"
                + (f"; not collected: {', '.join(missing)}" if missing else ""))

    def collect(self, readings, events, max_bytes, deadline):
        """Collect every source; (the tar.gz file's path, its manifest)."""
        files, not_collected = {}, []

        def keep(name, what, how, data):
            files[name] = {"what": what, "how": how, "data": data[:FILE_LIMIT_BYTES],
                           "truncated": len(data) > FILE_LIMIT_BYTES}

        kernel, how, why = self._kernel_log(deadline)
        if kernel is None:
            not_collected.append({"file": "kernel-gpu.log", "why": why})
        else:
            lines = kernel.splitlines(keepends=True)
            keep("kernel-gpu.log", "the kernel log since boot: NVRM, Xid, SXid, PCIe/AER and "
                 "machine-check lines", how, b"".join(l for l in lines if GPU_LINES.search(
                     l.decode(errors="replace"))))
            keep("kernel-tail.log", f"the kernel log's last {KERNEL_TAIL_LINES} lines", how,
                 b"".join(lines[-KERNEL_TAIL_LINES:]))
        for name, source, what in (("nvidia-smi-q.xml", "nvidia_smi", "nvidia-smi -q -x"),
                                   ("slurmd.log", "slurmd", "slurmd's journal, its last "
                                                            f"{SLURMD_LINES} lines")):
            output, why = self._run(source, deadline)
            if output is None:
                not_collected.append({"file": name, "why": why})
            else:
                keep(name, what, " ".join(self.commands[source]), output)
        keep("nvml.json", "the agent's NVML readings at collection time", "NVML",
             json.dumps(readings, indent=1, default=str).encode())
        keep("agent-events.json", "the events the agent raised in the last hour",
             "the agent's memory", json.dumps(events, indent=1, default=str).encode())
        report, why = self._bug_report(deadline)
        if report is None:
            not_collected.append({"file": "nvidia-bug-report.log.gz", "why": why})
        else:
            keep("nvidia-bug-report.log.gz", "nvidia-bug-report.sh's report",
                 " ".join(self.commands["bug_report"]), report)
        return self._pack(files, not_collected, max_bytes)

    def _kernel_log(self, deadline):
        output, why = self._run("kernel", deadline)
        if output is not None:
            return output, " ".join(self.commands["kernel"]), ""
        fallback, fallback_why = self._run("kernel_fallback", deadline)
        if fallback is not None:
            return fallback, " ".join(self.commands["kernel_fallback"]), ""
        return None, "", f"{why}; {fallback_why}"

    def _run(self, source, deadline):
        return self._run_argv(self.commands[source], deadline, SOURCE_TIMEOUT_S)

    def _run_argv(self, argv, deadline, limit_s):
        """(its stdout, "") or (None, why not)."""
        left = deadline - self._clock()
        if left <= 1:
            return None, "no time left before the deadline"
        try:
            result = subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL,
                                    timeout=min(limit_s, left))
        except FileNotFoundError:
            return None, f"{argv[0]} is not on this node"
        except subprocess.TimeoutExpired:
            return None, f"{argv[0]} did not finish within {min(limit_s, left):.0f} s"
        except OSError as exc:
            return None, f"{argv[0]} could not run: {exc}"
        if result.returncode != 0:
            tail = result.stderr.decode(errors="replace").strip()[-300:]
            return None, f"{argv[0]} exited with {result.returncode}: {tail}"
        return result.stdout, ""

    def _bug_report(self, deadline):
        """nvidia-bug-report.sh writes <output-file>.gz; it gets half of the time left."""
        left = deadline - self._clock()
        if left / 2 < BUG_REPORT_MIN_S:
            return None, f"skipped: {left:.0f} s left before the deadline"
        with tempfile.TemporaryDirectory() as folder:
            output = os.path.join(folder, "nvidia-bug-report.log")
            argv = [*self.commands["bug_report"], "--output-file", output]
            _, why = self._run_argv(argv, deadline, min(left / 2, BUG_REPORT_MAX_S))
            if why:
                return None, why
            try:
                with open(output + ".gz", "rb") as report:
                    return report.read(FILE_LIMIT_BYTES + 1), ""
            except OSError:
                return None, "nvidia-bug-report.sh wrote no report"

    def _pack(self, files, not_collected, max_bytes):
        """The tar.gz, leaving the largest files out while it is over max_bytes."""
        files = dict(files)
        while True:
            manifest = {"node": self.node_name, "files": [
                {"file": name, "what": entry["what"], "how": entry["how"],
                 "bytes": len(entry["data"]), "truncated": entry["truncated"]}
                for name, entry in files.items()], "not_collected": not_collected}
            path = self._write(files, manifest)
            if os.path.getsize(path) <= max_bytes or not files:
                return path, manifest
            os.unlink(path)
            largest = max(files, key=lambda name: len(files[name]["data"]))
            files.pop(largest)
            not_collected = [*not_collected,
                             {"file": largest, "why": f"left out: the bundle was over "
                                                      f"{max_bytes} bytes"}]

    def _write(self, files, manifest):
        handle, path = tempfile.mkstemp(prefix="clusterui-bundle-", suffix=".tar.gz")
        with os.fdopen(handle, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
            entries = {"manifest.json": json.dumps(manifest, indent=1).encode(),
                       **{name: entry["data"] for name, entry in files.items()}}
            for name, data in entries.items():
                info = tarfile.TarInfo(f"{self.node_name}/{name}")
                info.size = len(data)
                info.mtime = int(time.time())
                info.mode = 0o644
                tar.addfile(info, io.BytesIO(data))
        return path


def upload(path, url, token, tls, timeout_s):
    """POST the file (PROTOCOL.md): (status, detail, bytes, SHA-256)."""
    sha = hashlib.sha256()
    with open(path, "rb") as bundle:
        for chunk in iter(lambda: bundle.read(1024 * 1024), b""):
            sha.update(chunk)
    size = os.path.getsize(path)
    parts = urlsplit(url)
    if parts.scheme == "https":
        connection = http.client.HTTPSConnection(parts.netloc, timeout=timeout_s, context=tls)
    else:
        connection = http.client.HTTPConnection(parts.netloc, timeout=timeout_s)
    try:
        with open(path, "rb") as body:
            connection.request("POST", parts.path, body=body, headers={
                "Authorization": f"Bearer {token}", "Content-Type": "application/gzip",
                "Content-Length": str(size), "X-Content-SHA256": sha.hexdigest()})
            response = connection.getresponse()
            text = response.read(4096).decode(errors="replace")
    except OSError as exc:
        return 0, f"cannot reach the server: {exc}", size, sha.hexdigest()
    finally:
        connection.close()
    try:
        detail = json.loads(text).get("detail", text)
    except (ValueError, AttributeError):
        detail = text.strip()
    return response.status, detail, size, sha.hexdigest()


def _positive(value, default):
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
        else default

