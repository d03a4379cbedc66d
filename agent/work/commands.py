"""What the agent does for the server's `command` frames (shared/PROTOCOL.md).

The client answers `accepted` at once for an action its command handler supports, then
calls the handler's `run(action, params, client)`; a handler raises CommandFailed when the
action could not be carried out, and the client answers `failed` with its message; a
handler that returns a message has the client answer `ok` with it. A reboot has no `ok`
from the agent: the server sees it done when the node says hello with a new boot id.
`cleanup` and `reconfigure` (node hygiene) are agent.hygiene.HygieneCommands.

RebootCommand runs the configured reboot command; CommandSet joins a node's handlers
(agent.node.make_command_handler).
"""

import asyncio
import logging
import os
import shlex
import signal
import subprocess
import tempfile
import time

log = logging.getLogger(__name__)

DEFAULT_REBOOT_COMMAND = "systemctl reboot"
REBOOT_START_TIMEOUT_S = 60.0
OUTPUT_TAIL_CHARS = 1000
POLL_S = 0.05


class CommandFailed(Exception):
    """The action could not be carried out; the message says why (it goes to the server)."""


class CommandSet:
    """Several command handlers as one: each action goes to the handler that carries it out.
    A handler's run() returns None (a reboot: no `ok` follows) or the message of its `ok`."""

    def __init__(self, handlers):
        """handlers: None for one a node does not have (node hygiene's, with hygiene off)."""
        self._by_action = {action: handler for handler in handlers if handler is not None
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
