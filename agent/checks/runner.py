"""CheckRunner: runs one check at a time, each in a child process.

The child is `python -m agent.checks child <module>` in a session of its own: the
request (params, the agent's GPUs, the scratch dir) goes in as JSON on stdin, one JSON
object comes back on stdout ({"measurements": {...}} or {"error": "..."}), and the
verdict is decided here from the measurements. torch, CUDA contexts, NCCL and disk I/O
stay out of the agent's process and event loop; at the time limit the child's whole
process group is stopped (SIGTERM, then SIGKILL), and whatever the child does (crash,
hang, print garbage, leave processes behind) ends as an `error` result."""

import asyncio
import importlib
import json
import logging
import os
import signal
import sys
from pathlib import Path

import agent
from agent.checks import CHECKS, CheckError, error
from agent.checks.params import ParamError
from agent.compat import timeout

log = logging.getLogger(__name__)

PACKAGE_ROOT = Path(agent.__file__).resolve().parent.parent  # the child imports agent from here
RESULT_MAX_BYTES = 1024 * 1024  # a result frame must fit in the protocol's 1 MiB
STDERR_TAIL_BYTES = 2000  # how much of the child's stderr an error message quotes
TERM_GRACE_S = 3.0  # between SIGTERM (the child cleans up: storage removes its file) and SIGKILL
PIPE_CLOSE_WAIT_S = 5.0  # a process that left the child's session may hold its pipes open


def prepare(checks, check, params):
    """(the check's module, its params with defaults), or CheckError with the message
    for an unknown check or params that do not fit."""
    module_name = checks.get(check) if isinstance(check, str) else None
    if module_name is None:
        raise CheckError(f"unknown check {check!r}; this agent runs: {', '.join(sorted(checks))}")
    module = importlib.import_module(module_name)
    try:
        values = module.read_params({} if params is None else params)
    except ParamError as exc:
        raise CheckError(f"bad params for {check}: {exc}") from exc
    return module, values


class CheckRunner:
    def __init__(self, backend, scratch_dir, *, all_reduce_perf=None, checks=None, python=None):
        """backend: the agent's backend; its GPUs now are the inventory a check compares
        with (a GPU lost later is missing from a check). scratch_dir: where `storage`
        writes unless given a path. all_reduce_perf: nccl-tests' binary, when it is not
        on PATH. checks: {name: module} (default: every check of this package)."""
        self._inventory = [dict(gpu) for gpu in backend.gpus()]
        self._scratch_dir = str(scratch_dir)
        self._all_reduce_perf = all_reduce_perf
        self._checks = dict(CHECKS if checks is None else checks)
        self._python = python or sys.executable
        self._lock = asyncio.Lock()  # one check at a time: a second request waits

    @property
    def check_names(self):
        return sorted(self._checks)

    async def run(self, check, params):
        """The check_result's fields: {"status", "metrics", "message"}. Never raises
        (except when cancelled, which stops the child)."""
        try:
            module, values = prepare(self._checks, check, params)
        except CheckError as exc:
            return error(str(exc))
        async with self._lock:
            limit_s = module.time_limit_s(values, len(self._inventory))
            request = {
                "check": check,
                "params": values,
                "gpus": self._inventory,
                "scratch_dir": self._scratch_dir,
                "all_reduce_perf": self._all_reduce_perf,
            }
            log.info("check %s started (time limit %.0f s)", check, limit_s)
            argv = [self._python, "-m", "agent.checks", "child", module.__name__]
            outcome = await run_child(argv, request, limit_s)
        if "error" in outcome:
            return error(outcome["error"])
        try:
            return module.decide(outcome["measurements"], values, self._inventory)
        except Exception as exc:  # a bug in a decide(): the agent carries on
            log.exception("check %s: deciding from %r failed", check, outcome["measurements"])
            return error(f"deciding the result failed: {type(exc).__name__}: {exc}")


def child_environment():
    """The agent's environment, with CUDA devices numbered as NVML numbers GPUs (PCI
    bus order) and all of them visible: the checks measure the whole node."""
    environment = dict(os.environ)
    environment["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    environment.pop("CUDA_VISIBLE_DEVICES", None)
    return environment


async def run_child(argv, request, limit_s):
    """Run argv with the request on stdin; {"measurements": ...} or {"error": message}."""
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own process group, to stop all it starts
            cwd=PACKAGE_ROOT,
            env=child_environment(),
        )
    except OSError as exc:
        return {"error": f"cannot start the check's process {argv[0]}: {exc.strerror or exc}"}

    stdout = bytearray()
    stderr_tail = bytearray()
    readers = asyncio.gather(
        _feed(process.stdin, json.dumps(request).encode()),
        _read_capped(process.stdout, stdout, RESULT_MAX_BYTES + 1),
        _read_tail(process.stderr, stderr_tail, STDERR_TAIL_BYTES),
    )
    timed_out = False
    try:
        try:
            async with timeout(limit_s):
                await process.wait()
        except asyncio.TimeoutError:
            timed_out = True
            await _stop_group(process)
    except asyncio.CancelledError:  # the agent is stopping
        _signal_group(process.pid, signal.SIGKILL)
        readers.cancel()
        raise
    # whatever the child left running in its group goes with it
    _signal_group(process.pid, signal.SIGKILL)
    try:
        async with timeout(PIPE_CLOSE_WAIT_S):
            await readers
    except asyncio.TimeoutError:
        readers.cancel()
        log.warning("a process started by the check still holds its output open")

    stderr_text = bytes(stderr_tail).decode(errors="replace").strip()
    if timed_out:
        log.warning("check process timed out after %.0f s; stderr: %s", limit_s, stderr_text)
        return {"error": f"timed out after {limit_s:.0f} s"}
    return _read_outcome(bytes(stdout), process.returncode, stderr_text)


def _read_outcome(stdout, returncode, stderr_text):
    """The child's result when it printed one (even if it then died on the way out:
    CUDA teardown can crash after the work is done), else an error saying how it ended."""
    why = f": {stderr_text}" if stderr_text else " (nothing on stderr)"
    if len(stdout) > RESULT_MAX_BYTES:
        return {"error": f"the check's process printed more than {RESULT_MAX_BYTES} bytes"}
    try:
        outcome = json.loads(stdout)
    except ValueError:
        outcome = None
    if isinstance(outcome, dict) and isinstance(outcome.get("error"), str):
        return {"error": outcome["error"]}
    if isinstance(outcome, dict) and isinstance(outcome.get("measurements"), dict):
        if returncode != 0:
            log.warning("check process exited with %s after its result%s", returncode, why)
        return {"measurements": outcome["measurements"]}
    if returncode < 0:
        number = -returncode
        name = signal.Signals(number).name if number in signal.valid_signals() else "?"
        return {"error": f"the check's process was killed by signal {number} ({name}){why}"}
    if outcome is None and stdout.strip():
        return {
            "error": f"the check's process exited with {returncode} and printed no JSON "
            f"result{why}"
        }
    if outcome is None:
        return {"error": f"the check's process exited with {returncode} without a result{why}"}
    return {"error": f"the check's process printed an unexpected result: {stdout[:200]!r}"}


async def _feed(stream, data):
    try:
        stream.write(data)
        await stream.drain()
        stream.close()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the child ended without reading its request: its exit tells why


async def _read_capped(stream, into, limit):
    while chunk := await stream.read(65536):
        if len(into) < limit:
            into += chunk[: limit - len(into)]


async def _read_tail(stream, into, keep):
    while chunk := await stream.read(65536):
        into += chunk
        del into[:-keep]


async def _stop_group(process):
    """SIGTERM to the child's group, then SIGKILL if the child is still there after
    the grace time."""
    _signal_group(process.pid, signal.SIGTERM)
    try:
        async with timeout(TERM_GRACE_S):
            await process.wait()
    except asyncio.TimeoutError:
        _signal_group(process.pid, signal.SIGKILL)
        await process.wait()


def _signal_group(pgid, signum):
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone
