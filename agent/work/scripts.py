"""Startup scripts on the node (shared/PROTOCOL.md: `config` startup_scripts, `script_result`).

- save_scripts() / load_scripts(): the agent keeps the latest config's scripts in the state
  dir, where the Slurm hook (agent/hook.py) reads them.
- run_script(): runs one script with bash, in a session of its own, with its time limit
  (then the whole process group is killed) and keeps the last 4 KiB of its output.
- ResultSpool: script_result frames wait as files in the state dir until the agent has sent
  them, across reconnects and restarts; the hook writes its results there too.
- Boot scripts run once per boot (the boot id they ran for is kept in the state dir), as the
  server holds a node with a new boot id in booting until their results arrive.
"""

import json
import logging
import os
import signal
import subprocess
import tempfile
import time
import uuid

log = logging.getLogger(__name__)

SCRIPTS_FILE = "startup_scripts.json"
BOOT_DONE_FILE = "boot_scripts_done"
SPOOL_DIR = "script_results"
OUTPUT_TAIL_BYTES = 4096
DEFAULT_TIMEOUT_S = 300
POLL_S = 0.05


def _write_atomically(path, text):
    folder = os.path.dirname(path)
    fd, temp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(temp, 0o600)
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise


def valid_scripts(scripts):
    """The entries of a config's startup_scripts that can be run; others are logged."""
    kept = []
    for script in scripts if isinstance(scripts, list) else []:
        if (isinstance(script, dict) and isinstance(script.get("id"), int)
                and isinstance(script.get("body"), str)
                and script.get("event") in ("node_boot", "job_start", "job_end")):
            kept.append(script)
        else:
            log.warning("ignoring a startup script the agent cannot run: %.200r", script)
    return kept


def save_scripts(state_dir, scripts):
    _write_atomically(os.path.join(state_dir, SCRIPTS_FILE), json.dumps(scripts))


def load_scripts(state_dir):
    """The scripts of the last config the agent saved; None when it saved none yet."""
    try:
        with open(os.path.join(state_dir, SCRIPTS_FILE), encoding="utf-8") as handle:
            return valid_scripts(json.load(handle))
    except FileNotFoundError:
        return None


def boot_scripts_ran_for(state_dir):
    try:
        with open(os.path.join(state_dir, BOOT_DONE_FILE), encoding="utf-8") as handle:
            return handle.read().strip()
    except FileNotFoundError:
        return ""


def mark_boot_scripts_ran(state_dir, boot_id):
    _write_atomically(os.path.join(state_dir, BOOT_DONE_FILE), boot_id + "\n")


def _timeout_of(script):
    value = script.get("timeout_s")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return DEFAULT_TIMEOUT_S
    return value


def secrets_of(script):
    """The config entry's `env`: the server's secrets the script names, {NAME: value}."""
    env = script.get("env")
    if not isinstance(env, dict):
        return {}
    return {name: value for name, value in env.items()
            if isinstance(name, str) and isinstance(value, str)}


def mask_secrets(text, secrets):
    """`text` with each secret's value replaced by <secret NAME> (longest first)."""
    for name, value in sorted(secrets.items(), key=lambda item: -len(item[1])):
        if value:
            text = text.replace(value, f"<secret {name}>")
    return text


def run_script(script, *, job_id=None, env=None, cwd="/"):
    """Run one script (a config entry) with bash, the secrets it was sent in its
    environment; its script_result frame, with those masked in its output."""
    timeout_s = _timeout_of(script)
    secrets = secrets_of(script)
    env = {**(os.environ if env is None else env), **secrets}
    started = time.monotonic()
    timed_out = False
    with tempfile.TemporaryDirectory(prefix="clusterui-script-") as folder:
        path = os.path.join(folder, f"script-{script['id']}.sh")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(script["body"])
        with tempfile.TemporaryFile() as output:
            try:
                process = subprocess.Popen(
                    ["bash", path], stdin=subprocess.DEVNULL, stdout=output,
                    stderr=subprocess.STDOUT, start_new_session=True, cwd=cwd, env=env)
            except OSError as exc:
                exit_code = 127
                output.write(f"cannot run bash: {exc.strerror or exc}\n".encode())
            else:
                try:
                    exit_code = process.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                    exit_code = None
                    timed_out = True
            size = output.seek(0, os.SEEK_END)
            output.seek(max(0, size - OUTPUT_TAIL_BYTES))
            tail = output.read().decode(errors="replace")
    tail = mask_secrets(tail, secrets)
    if timed_out:
        tail += f"\n[killed at its time limit of {timeout_s:g} s]"
        tail = tail[-OUTPUT_TAIL_BYTES:]
    return {
        "type": "script_result", "script_id": script["id"], "version": script.get("version"),
        "event": script["event"], "job_id": job_id, "exit_code": exit_code,
        "timed_out": timed_out, "duration_s": round(time.monotonic() - started, 3),
        "output_tail": tail, "ts": time.time(),
    }


def succeeded(result):
    return result["exit_code"] == 0 and not result["timed_out"]


class ResultSpool:
    """script_result frames as files (one each) in <state dir>/script_results, oldest first."""

    def __init__(self, state_dir):
        self.folder = os.path.join(state_dir, SPOOL_DIR)
        os.makedirs(self.folder, mode=0o700, exist_ok=True)

    def add(self, frame):
        name = f"{time.time_ns():020d}-{uuid.uuid4().hex}.json"
        path = os.path.join(self.folder, name)
        _write_atomically(path, json.dumps(frame))
        return path

    def pending(self):
        """[(path, frame)]; a file that cannot be read is logged and removed."""
        found = []
        for name in sorted(os.listdir(self.folder)):
            if not name.endswith(".json") or name.startswith("."):
                continue
            path = os.path.join(self.folder, name)
            try:
                with open(path, encoding="utf-8") as handle:
                    found.append((path, json.load(handle)))
            except FileNotFoundError:
                continue
            except ValueError:
                log.error("dropping an unreadable script result %s", path)
                os.unlink(path)
        return found

    def remove(self, path):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
