"""Simulation: a node with no GPU, for demos, tests and load tests.

    node.py        build_simulated_node(config): the simulated node, as agent.node.Node
    backend.py     GPUs replaying a real H200 trace (agent/data/h200/), with faults
    kernel_log.py  the simulated kernel log the faults write Xid lines into
    inject.py      the fault schedule: what each --inject fault does; the fleet's
                   per-node inject file
    hygiene.py     node hygiene's readings, events and commands, simulated
    checks.py      the active checks, with made-up but realistic measurements
    boot.py        the boot id kept in the state dir, and the simulated reboot
    workload.py    the demo fleet's Slurm jobs, which its GPUs and job ends follow and the
                   demo's Slurm commands (demo/slurm) list
    fleet.py       `python -m agent.sim.fleet`: many simulated nodes in one process

Only the entry points import this package (agent.cli for --simulate, and the fleet):
production modules never test for a simulated backend nor branch on --simulate."""

from agent.sim.backend import SimulatedBackend, simulated_gpu_uuid
from agent.sim.boot import SIMULATED_BOOT_ID_FILE, simulated_boot_id
from agent.sim.inject import INJECT_FILE
from agent.sim.node import build_simulated_node

__all__ = [
    "INJECT_FILE",
    "SIMULATED_BOOT_ID_FILE",
    "SimulatedBackend",
    "build_simulated_node",
    "simulated_boot_id",
    "simulated_gpu_uuid",
]
