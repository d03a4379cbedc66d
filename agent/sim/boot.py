"""A simulated node's boot: its boot id, kept in the state dir, and the reboot the
server asks for (command `reboot`)."""

import logging
import os
import uuid

from agent.config import DEFAULT_SIMULATED_BOOT_S

log = logging.getLogger(__name__)

SIMULATED_BOOT_ID_FILE = "simulated_boot_id"


def simulated_boot_id(state_dir):
    """A boot id for a simulated node: kept in the state dir, so an agent restart is not
    a reboot (delete the file, or have the server reboot the node, to simulate one). Where
    the state dir cannot be written (say --print-once as a normal user), a new id for this
    process only."""
    path = os.path.join(state_dir, SIMULATED_BOOT_ID_FILE)
    try:
        with open(path) as f:
            stored = f.read().strip()
        if stored:
            return stored
    except OSError:
        pass
    return new_simulated_boot_id(state_dir)


def new_simulated_boot_id(state_dir):
    """A new boot id for a simulated node, kept in the state dir: the node rebooted."""
    path = os.path.join(state_dir, SIMULATED_BOOT_ID_FILE)
    new_id = str(uuid.uuid4())
    try:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        with open(path + ".new", "w") as f:
            f.write(new_id + "\n")
        os.replace(path + ".new", path)
    except OSError as exc:
        log.debug("cannot keep the simulated boot id in %s: %s", path, exc)
    return new_id


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
        boot_id = new_simulated_boot_id(self._state_dir)
        log.warning("simulated reboot of %s: back in %g s with boot id %s",
                    client.node_name, self._boot_s, boot_id)
        self._backend.reboot()
        await client.reboot_into(boot_id, down_s=self._boot_s)
