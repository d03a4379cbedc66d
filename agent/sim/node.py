"""A simulated node's assembly: build_simulated_node(config) gives the same Node as
agent.node.build_node, with the simulated backend (replaying a real H200, with the
--inject faults), its kernel log for the Xid watcher, its node hygiene, checks, reboot and
boot id, and no Slurm (a simulated node is not a Slurm node, even on a machine with
scontrol) unless it runs the demo's simulated Slurm (agent/sim/workload.py)."""

import time
from importlib import resources

from agent.detectors import reading_watchers
from agent.detectors.xid import XidWatcher
from agent.hygiene import Hygiene, make_hygiene
from agent.node import Node
from agent.node_metrics import NodeMetrics
from agent.sim.backend import SimulatedBackend
from agent.sim.boot import SimulatedReboot, simulated_boot_id
from agent.sim.checks import SimulatedCheckRunner
from agent.sim.hygiene import SimulatedHygiene
from agent.work.bundles import BundleCommand
from agent.work.commands import CommandSet


def build_simulated_node(config, *, host_metrics=None, workload=None):
    """A simulated node for config (node_name, gpus, inject, state_dir, simulated_boot_s,
    hygiene, throttle_hold_s). host_metrics(backend): the node's CPU, memory and network
    reader (default: this machine's, NodeMetrics). workload: the fleet's jobs
    (agent.sim.workload.WorkloadFile; the demo), which its GPUs and job ends follow; default
    none. Start it with node.start()."""
    running = None if workload is None else (
        lambda: workload.current().running_on(config.node_name, time.time()))
    backend = SimulatedBackend(config.node_name, gpu_count=config.gpus, faults=config.inject,
                               job=running)
    return Node(
        name=config.node_name, backend=backend, boot_id=simulated_boot_id(config.state_dir),
        node_metrics=host_metrics(backend) if host_metrics else NodeMetrics(),
        read_slurm=no_slurm if workload is None else simulated_slurm(workload),
        kind="simulated",
        start_work=lambda node: _start_work(config, node, workload))


def _start_work(config, node, workload):
    backend = node.backend
    hygiene = simulated_hygiene(config, backend, workload=workload)
    node.watchers = simulated_watchers(config, backend) + hygiene.watchers
    node.check_runner = SimulatedCheckRunner(backend, config.state_dir)
    node.command_handler = simulated_command_handler(config, backend, hygiene)
    node.hygiene_status = hygiene.status


def no_slurm(node_name):
    """A simulated node's `slurm`: it runs no Slurm, even where this machine has scontrol."""
    return None


def simulated_slurm(workload):
    """The hello's `slurm` of a node of the demo fleet: the simulated Slurm's state of it."""
    def read(node_name):
        state, reason = workload.current().node_state(node_name, time.time())
        return {"state": state, "reason": reason}
    return read


def simulated_watchers(config, backend):
    """Throttle, ECC, and Xid from the backend's simulated kernel log; started."""
    gpus = backend.gpus()
    return reading_watchers(config) + [XidWatcher(gpus, [backend.kernel_log])]


def simulated_hygiene(config, backend, *, workload=None):
    """Node hygiene on a simulated node: simulated (agent/sim/hygiene.py, reporting the
    ends of the workload's jobs, when given) unless said; with hygiene asked for, the
    real watchers on this machine's processes and Slurm daemons beside the simulated GPUs
    (the tests); none with hygiene off."""
    if config.hygiene.enabled is None:
        simulated = SimulatedHygiene(config.node_name, backend, config.inject,
                                     jobs=workload)
        parts = {part: (lambda part=part: simulated.status_of(part))
                 for part in ("slurmd", "processes", "gres")}
        return Hygiene(watchers=[simulated], parts=parts, commands=simulated)
    device_dir = config.hygiene.gpu_device_dir
    return make_hygiene(config, read_gpus=lambda: simulated_gpus(backend, device_dir=device_dir))


def simulated_gpus(backend, *, device_dir="/dev"):
    """A simulated node's GPUs in agent.hygiene.gres.nvml_gpus()'s shape, their minor
    numbers their indexes (as on the real H200: GPU 0 is minor 0), beside this machine's
    real Slurm (tests)."""
    return [{"index": gpu["index"], "uuid": gpu["uuid"], "minor": gpu["index"],
             "device": f"{device_dir}/nvidia{gpu['index']}", "mig": False}
            for gpu in backend.gpus()]


class SimulatedGpuReset:
    """A simulated node's `reset_gpu`: the backend's (no nvidia-smi to run)."""

    actions = ("reset_gpu",)

    def __init__(self, backend):
        self._backend = backend

    async def run(self, action, params, client):
        return self._backend.reset_gpu((params or {}).get("gpu_uuid"))


def simulated_command_handler(config, backend, hygiene):
    """A simulated node's commands: its reboot (agent/sim/boot.py), a GPU reset, a
    diagnostic bundle, node hygiene's."""
    reboot = SimulatedReboot(backend, config.state_dir, boot_s=config.simulated_boot_s)
    return CommandSet([reboot, SimulatedGpuReset(backend),
                       SimulatedBundle(config.node_name, backend), hygiene.commands])


class SimulatedBundle(BundleCommand):
    """A simulated node's diagnostic bundle: its simulated kernel log (the Xid lines its
    faults wrote), the real H200's `nvidia-smi -q -x` (agent/data/h200/), and no slurmd or
    nvidia-bug-report.sh, which the manifest says."""

    def __init__(self, node_name, backend):
        super().__init__(node_name)
        self._backend = backend

    def _run(self, source, deadline):
        if source in ("kernel", "kernel_fallback"):
            return self._backend.kernel_log.since_boot(), ""
        if source == "nvidia_smi":
            return (resources.files("agent") / "data" / "h200" / "nvidia-smi-q.xml"
                    ).read_bytes(), ""
        return None, "a simulated node runs no slurmd"

    def _bug_report(self, deadline):
        return None, "a simulated node has no nvidia-bug-report.sh"
