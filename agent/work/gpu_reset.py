"""The server's `reset_gpu` command (shared/PROTOCOL.md): reset one GPU of this node, never
one that a process holds.

In order, each step answering `failed` with why when it cannot go on:
1. the GPU named by `gpu_uuid` is this node's (NVML knows the UUID);
2. no compute process holds it (NVML's compute processes): else "busy: pid 5123 holds the
   GPU";
3. the topology allows one GPU to be reset on its own (single_reset_refusal): else
   "refused: ...", and the server's ladder goes on to a reboot;
4. persistence mode, which holds the GPU open, is turned off for the reset and back on
   after it;
5. the reset command runs (`nvidia-smi --gpu-reset -i {index}`), with a time limit;
6. the GPU answers NVML again (its UUID, its temperature) within a time limit: `ok`.

The NVML calls are nvidia-ml-py's; `nvml` is that module (tests give a fake shaped by it).
"""

import asyncio
import logging
import shlex
import subprocess
import time
from pathlib import Path

from agent.work.commands import OUTPUT_TAIL_CHARS, CommandFailed

log = logging.getLogger(__name__)

DEFAULT_RESET_COMMAND = "nvidia-smi --gpu-reset -i {index}"
DEFAULT_PERSISTENCE_COMMAND = "nvidia-smi -i {index} -pm {mode}"
RESET_TIMEOUT_S = 120.0
ANSWER_TIMEOUT_S = 60.0
ANSWER_POLL_S = 1.0


def fabric_manager_running(proc="/proc"):
    """Whether NVIDIA's Fabric Manager (nv-fabricmanager; its comm is cut to 15 characters)
    runs on this machine."""
    for comm in Path(proc).glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip() == "nv-fabricmanage":
                return True
        except OSError:
            continue  # the process ended meanwhile
    return False


def nvlink_peers(nvml, handle):
    """The remote device type (NVML_NVLINK_DEVICE_TYPE_*) of each of the GPU's active
    NVLinks; none where NVLink is not supported (a PCIe GPU, a VM)."""
    peers = []
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvml.NVML_FEATURE_ENABLED:
                continue
            peers.append(nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link))
        except nvml.NVMLError:
            continue  # no such link, or NVLink not supported here
    return peers


def single_reset_refusal(nvml, handle, fabric_manager=fabric_manager_running):
    """Why this GPU cannot be reset on its own, or "" (NVIDIA's nvidia-smi manual, `-r`,
    and the Fabric Manager user guide's reset table):
    - before Ampere (V100), every GPU NVLinked to it must be reset in the same command;
    - Ampere with NVSwitches (HGX A100): one GPU may be reset only through Fabric Manager;
      without it, every GPU and NVSwitch together;
    - Hopper and later: a GPU may be reset on its own on bare metal.
    A GPU without active NVLinks may always be reset alone."""
    try:
        architecture = nvml.nvmlDeviceGetArchitecture(handle)
    except nvml.NVMLError:
        return ""
    if architecture >= nvml.NVML_DEVICE_ARCH_HOPPER:
        return ""
    peers = nvlink_peers(nvml, handle)
    if not peers:
        return ""
    if architecture < nvml.NVML_DEVICE_ARCH_AMPERE:
        return ("refused: on a GPU before Ampere every GPU NVLinked to it must be reset with "
                "it, which would stop the whole node's work")
    if nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH in peers and not fabric_manager():
        return ("refused: the fabric manager needs every GPU reset together (an Ampere "
                "NVSwitch system resets one GPU only through Fabric Manager, which is not "
                "running)")
    return ""


class GpuResetCommand:
    """Carries out `reset_gpu`. run() is called by the client after it answered `accepted`;
    it returns the `ok` message or raises CommandFailed."""

    actions = ("reset_gpu",)

    def __init__(self, nvml, *, reset_command=DEFAULT_RESET_COMMAND,
                 persistence_command=DEFAULT_PERSISTENCE_COMMAND, reset_timeout_s=RESET_TIMEOUT_S,
                 answer_timeout_s=ANSWER_TIMEOUT_S, answer_poll_s=ANSWER_POLL_S,
                 fabric_manager=fabric_manager_running):
        self._nvml = nvml
        self._fabric_manager = fabric_manager
        self._reset_command = reset_command
        self._persistence_command = persistence_command
        self._reset_timeout_s = reset_timeout_s
        self._answer_timeout_s = answer_timeout_s
        self._answer_poll_s = answer_poll_s

    async def run(self, action, params, client):
        return await asyncio.to_thread(self.reset, (params or {}).get("gpu_uuid"))

    def reset(self, uuid):
        nvml = self._nvml
        if not isinstance(uuid, str) or not uuid:
            raise CommandFailed("reset_gpu needs params.gpu_uuid")
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            index = nvml.nvmlDeviceGetIndex(handle)
        except nvml.NVMLError as exc:
            raise CommandFailed(f"no GPU {uuid} on this node answers NVML: {exc}") from exc
        holders = self._holders(handle)
        if holders:
            raise CommandFailed(f"busy: pid {holders[0]} holds the GPU"
                                + (f" (and {len(holders) - 1} more)" if len(holders) > 1
                                   else ""))
        refusal = single_reset_refusal(nvml, handle, self._fabric_manager)
        if refusal:
            raise CommandFailed(refusal)
        persistent = self._persistence_mode(handle)
        if persistent:
            self._run(self._persistence_command.format(index=index, mode=0),
                      "turning persistence mode off")
        try:
            output = self._run(self._reset_command.format(index=index), "the reset")
        finally:
            if persistent:
                self._turn_persistence_back_on(index)
        self._wait_until_it_answers(uuid)
        log.warning("reset GPU %s (%s) as the server asked", index, uuid)
        return f"GPU {index} ({uuid}) reset and answers NVML again: {output}"[:OUTPUT_TAIL_CHARS]

    def _holders(self, handle):
        """The pids of the compute processes on the GPU."""
        try:
            processes = self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except self._nvml.NVMLError as exc:
            raise CommandFailed(f"cannot tell whether a process holds the GPU: {exc}") from exc
        return [process.pid for process in processes]

    def _persistence_mode(self, handle):
        try:
            return self._nvml.nvmlDeviceGetPersistenceMode(handle) == 1
        except self._nvml.NVMLError:
            return False

    def _turn_persistence_back_on(self, index):
        try:
            self._run(self._persistence_command.format(index=index, mode=1),
                      "turning persistence mode back on")
        except CommandFailed:
            log.exception("GPU %s: persistence mode stays off", index)

    def _run(self, command, what):
        """Run one command; its output, or CommandFailed with its status and output."""
        try:
            result = subprocess.run(shlex.split(command), capture_output=True, text=True,
                                    timeout=self._reset_timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise CommandFailed(f"{what} (`{command}`) did not finish within "
                                f"{self._reset_timeout_s:g} s") from exc
        except OSError as exc:
            raise CommandFailed(f"cannot run `{command}`: {exc.strerror or exc}") from exc
        output = (result.stdout + result.stderr).strip()
        if result.returncode != 0:
            raise CommandFailed(f"{what} (`{command}`) exited with status {result.returncode}: "
                                f"{output[-OUTPUT_TAIL_CHARS:]}")
        return output

    def _wait_until_it_answers(self, uuid):
        nvml = self._nvml
        deadline = time.monotonic() + self._answer_timeout_s
        while True:
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
                nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
                return
            except nvml.NVMLError as exc:
                if time.monotonic() >= deadline:
                    raise CommandFailed(f"the GPU was reset but does not answer NVML within "
                                        f"{self._answer_timeout_s:g} s: {exc}") from exc
            time.sleep(self._answer_poll_s)
