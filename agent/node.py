"""One node as the client drives it (Node), and its assembly for this machine's GPUs
(build_node: NVML, the real watchers, commands, checks and readings). A simulated node
is assembled the same way, into the same Node, by agent.sim.build_simulated_node; the
command line (agent/cli.py) chooses which, in one place.

A Node is built in two steps: build_node() opens the backend and reads the boot id (all
`--print-once` needs); node.start() starts the rest (the watchers, node hygiene, the
check runner and the command handler) for the client. node.close() stops them all."""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent import host
from agent.detectors import close_watchers, make_watchers
from agent.hygiene import make_hygiene
from agent.node_metrics import NodeMetrics
from agent.work.commands import CommandSet, RebootCommand
from agent.work.bundles import BundleCommand
from agent.work.gpu_reset import GpuResetCommand


@dataclass(eq=False)
class Node:
    """What the client reads and drives on one node.

    backend: the GPUs (agent/backends); boot_id: the hello's; node_metrics: CPU, memory
    and network (read()); read_slurm(node_name): the hello's `slurm`; watchers: the started
    detectors and hygiene watchers the client polls; check_runner: runs `run_check` (None:
    no checks); command_handler: carries out `command` (None: none); hygiene_status():
    node hygiene's readings for the samples (None: none). start_work(node) fills in the
    watchers, check runner, command handler and hygiene readings (node.start())."""

    name: str
    backend: Any
    boot_id: str
    node_metrics: Any
    read_slurm: Callable = host.slurm_status
    watchers: list = field(default_factory=list)
    check_runner: Any = None
    command_handler: Any = None
    hygiene_status: Callable | None = None
    kind: str = "NVML"  # what the agent's log calls its GPUs
    start_work: Callable | None = None

    def start(self):
        """Start the watchers, node hygiene, the checks and the commands (once)."""
        if self.start_work is not None:
            start_work, self.start_work = self.start_work, None
            start_work(self)
        return self

    def close(self):
        """Stop the watchers, then the backend (NVML shuts down last)."""
        close_watchers(self.watchers)
        self.backend.close()


def build_node(config):
    """This machine's node: its GPUs through NVML, its kernel boot id, its Slurm state.
    Raises BackendUnavailable (no NVIDIA driver) or OSError (no boot id)."""
    from agent.backends.nvml import NvmlBackend

    backend = NvmlBackend()
    return Node(name=config.node_name, backend=backend, boot_id=host.boot_id(),
                node_metrics=NodeMetrics(), read_slurm=host.slurm_status, kind="NVML",
                start_work=lambda node: _start_work(config, node))


def _start_work(config, node):
    from agent.checks.runner import CheckRunner

    hygiene = make_hygiene(config, node.backend.nvml)
    node.watchers = make_watchers(config, node.backend) + hygiene.watchers
    node.check_runner = CheckRunner(node.backend, config.state_dir)
    node.command_handler = make_command_handler(config, hygiene, node.backend.nvml)
    node.hygiene_status = hygiene.status


def make_command_handler(config, hygiene, nvml):
    """The server's commands on this machine: a reboot runs the configured reboot command; a
    GPU reset, nvidia-smi's (agent/work/gpu_reset.py); a diagnostic bundle
    (agent/work/bundles.py); node hygiene's cleanup and reconfigure."""
    return CommandSet([RebootCommand(config.reboot_command), GpuResetCommand(nvml),
                       BundleCommand(config.node_name), hygiene.commands])
