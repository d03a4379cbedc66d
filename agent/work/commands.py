"""What the agent does for the server's `command` frames (shared/PROTOCOL.md).

The client answers `accepted` at once for an action its command handler supports, then
calls the handler's `run(action, params, client)`; a handler raises CommandFailed when the
action could not be carried out, and the client answers `failed` with its message; a
handler that returns a message has the client answer `ok` with it. A reboot has no `ok`
from the agent: the server sees it done when the node says hello with a new boot id.
`cleanup` and `reconfigure` (node hygiene) are agent.hygiene.HygieneCommands.

- RebootCommand (real nodes) runs the configured reboot command.
- SimulatedReboot (--simulate and the demo fleet) reboots a simulated node.
"""

import asyncio
import logging
import os
import shlex
import signal
import subprocess
import tempfile
import time

from agent import host

log = logging.getLogger(__name__)

DEFAULT_REBOOT_COMMAND = "systemctl reboot"
REBOOT_START_TIMEOUT_S = 60.0
DEFAULT_SIMULATED_BOOT_S = 5.0
OUTPUT_TAIL_CHARS = 1000
POLL_S = 0.05


class CommandFailed(Exception):
    """The action could not be carried out; the message says why (it goes to the server)."""


class CommandSet:
    """Several command handlers as one: each action goes to the handler that carries it out.
    A handler's run() returns None (a reboot: no `ok` follows) or the message of its `ok`."""

    def __init__(self, handlers):
        self._by_action = {action: handler for handler in handlers
                           for action in handler.actions}
        self.actions = tuple(self._by_action)

    async def run(self, action, params, client):
        return await self._by_action[action].run(action, params, client)


class RebootCommand:
    """Runs the reboot command (`systemctl reboot` by default) in a session of its own, so
    that stopping the agent, which the reboot itself does, does not stop it.

    The command has `start_timeout_s` to finish starting the reboot (systemctl returns once
    the reboot is queued). Exit 0: the node is going down. A command that cannot be run,
    exits with another status, or is still running at the limit (then stopped, with its
    process group) fails with the reason and the end of its output."""

    actions = ("reboot",)

    def __init__(self, command=DEFAULT_REBOOT_COMMAND, start_timeout_s=REBOOT_START_TIMEOUT_S):
        self.command = command
        self._argv = shlex.split(command)
        self._start_timeout_s = start_timeout_s

    async def run(self, action, params, client):
        log.warning("reboot asked by the server: running `%s`", self.command)
        with tempfile.TemporaryFile() as output:
            try:
                process = subprocess.Popen(
                    self._argv, stdin=subprocess.DEVNULL, stdout=output,
                    stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as exc:
                raise CommandFailed(
                    f"cannot run the reboot command `{self.command}`: {exc.strerror or exc}"
                ) from exc
            # Polled, not awaited through asyncio's child watcher: a child asyncio owns is
            # killed when the agent's event loop closes, and this one must outlive the agent.
            deadline = time.monotonic() + self._start_timeout_s
            while process.poll() is None:
                if time.monotonic() >= deadline:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                    raise CommandFailed(
                        f"the reboot command `{self.command}` did not finish within "
                        f"{self._start_timeout_s:g} s (stopped){_tail(output)}")
                await asyncio.sleep(POLL_S)
            if process.returncode != 0:
                raise CommandFailed(
                    f"the reboot command `{self.command}` exited with {process.returncode}"
                    f"{_tail(output)}")
        log.warning("`%s` done: the node is going down", self.command)


def _tail(output):
    output.seek(0)
    text = output.read().decode(errors="replace").strip()
    return f": {text[-OUTPUT_TAIL_CHARS:]}" if text else ""


class SimulatedReboot:
    """A simulated node reboots as the server sees a real one do it: a new boot id (kept in
    the state dir), the injected faults gone (a GPU that fell off the bus is back, the
    volatile ECC counts and thermal slowdown reset: SimulatedBackend.reboot), the connection
    closed, and `boot_s` later a hello with the new boot id."""

    actions = ("reboot",)

    def __init__(self, backend, state_dir, boot_s=DEFAULT_SIMULATED_BOOT_S):
        self._backend = backend
        self._state_dir = state_dir
        self._boot_s = boot_s

    async def run(self, action, params, client):
        boot_id = host.new_simulated_boot_id(self._state_dir)
        log.warning("simulated reboot of %s: back in %g s with boot id %s",
                    client.node_name, self._boot_s, boot_id)
        self._backend.reboot()
        await client.reboot_into(boot_id, down_s=self._boot_s)
