"""`python -m agent.sim.fleet`: many simulated nodes in one process, for demos and load
tests.

Each node is a full AgentClient (hello, samples, durable events, tokens, backoff) on a
simulated node (agent.sim.build_simulated_node, as `python -m agent --simulate` runs),
with its own state dir under --state-dir:

    <state-dir>/<node>/node_token          the node's token (a join token is used without)
    <state-dir>/<node>/simulated_boot_id   its boot id (new at each reboot the server asks)
    <state-dir>/<node>/inject              optional: --inject specs, one per line (the GPUs'
                                           faults and node hygiene's, agent/sim/inject.py)
    <state-dir>/<node>/outbox.sqlite3      its unacked events

    python -m agent.sim.fleet --server ws://127.0.0.1:8000/ws/agent/ --state-dir var/fleet \\
        --names 'gpu-{:03d}' --count 64 [--token-file FILE] [--slurm-state FILE]

The join token, for nodes without a node token, comes as the agent's does: --token-file,
or CLUSTERUI_AGENT_TOKEN; never the command line.
"""

import argparse
import asyncio
import logging
import math
import os
import signal
import sys
import time
import zlib

from agent.config import (
    DEFAULT_SIMULATED_BOOT_S,
    TOKEN_ENVIRONMENT,
    TOKEN_ON_ARGV,
    Config,
    ConfigError,
    InjectSpecError,
    check_server,
    read_join_token,
    tls_context,
)
from agent.connection.client import AgentClient
from agent.connection.node_token import read_node_token
from agent.connection.outbox import Outbox
from agent.sim import build_simulated_node
from agent.sim.inject import read_faults
from agent.sim.workload import WorkloadFile

log = logging.getLogger("agent.sim.fleet")

OUTBOX_FILE = "outbox.sqlite3"
# A simulated node's host: 2 TiB of memory, and training traffic that follows its GPUs.
HOST_MEMORY_BYTES = 2 * 2**40
PEAK_NET_BPS = 0.6e9  # per direction, bytes per second (4.8 Gb/s), with every GPU busy


class SimulatedNodeMetrics:
    """CPU, memory and network of a simulated node, following its GPUs' load."""

    def __init__(self, backend, phase):
        self._backend = backend
        self._phase = phase

    def read(self):
        return self.following(self._backend.read_gpus(), time.monotonic())

    def following(self, gpus, t):
        """The node's readings with these GPU readings at time t (seconds)."""
        load = sum(g["util_pct"] or 0 for g in gpus) / (100.0 * len(gpus)) if gpus else 0.0
        wobble = 0.9 + 0.1 * math.sin(t / 7.0 + self._phase)
        return {
            "cpu_pct": round(5 + 40 * load * wobble, 1),
            "mem_used_bytes": int(HOST_MEMORY_BYTES * (0.08 + 0.3 * load)),
            "net_rx_bps": round(PEAK_NET_BPS * load * wobble),
            "net_tx_bps": round(0.85 * PEAK_NET_BPS * load * wobble),
        }


def build_client(name, args):
    """The started client of node `name` (and its outbox, to close)."""
    state_dir = os.path.join(args.state_dir, name)
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    node_token = read_node_token(state_dir)
    if not node_token and not args.token:
        raise SystemExit(f"fleet: {state_dir} holds no node token, and no join token was "
                         f"given (--token-file or {TOKEN_ENVIRONMENT})")
    config = Config(
        server=args.server, token=args.token, node_name=name, state_dir=state_dir,
        sample_interval_s=args.sample_interval, simulate=True, gpus=args.gpus,
        inject=read_faults(state_dir, args.gpus), simulated_boot_s=args.simulated_boot)
    phase = zlib.crc32(name.encode()) % 360
    node = build_simulated_node(
        config, host_metrics=lambda backend: SimulatedNodeMetrics(backend, phase=phase),
        workload=args.workload).start()
    outbox = Outbox(os.path.join(state_dir, OUTBOX_FILE))
    client = AgentClient(config, node, outbox=outbox, node_token=node_token, tls=args.tls)
    return client, outbox


async def run_fleet(clients):
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, task.cancel)
    runs = []
    for client in clients:
        runs.append(asyncio.create_task(client.run(), name=client.node_name))
        await asyncio.sleep(0.02)  # stagger: a fleet does not say hello in one millisecond
    try:
        await asyncio.gather(*runs)
    except asyncio.CancelledError:
        for run in runs:
            run.cancel()
        await asyncio.gather(*runs, return_exceptions=True)
        log.info("fleet stopped")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m agent.sim.fleet", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", required=True, help="ws[s]://HOST/ws/agent/")
    parser.add_argument("--state-dir", required=True, help="one folder per node below it")
    parser.add_argument("--names", default="node-{:03d}", help="a format for the node names")
    parser.add_argument("--count", type=int, required=True, help="how many nodes")
    parser.add_argument("--first", type=int, default=1, help="the number of the first node")
    parser.add_argument("--token-file", metavar="FILE",
                        help=f"a file holding a join token, for nodes without a node token "
                             f"(or {TOKEN_ENVIRONMENT})")
    parser.add_argument("--token", help=argparse.SUPPRESS)  # refused: see TOKEN_ON_ARGV
    parser.add_argument("--insecure", action="store_true",
                        help="allow ws:// to another machine (plaintext: a test network only)")
    parser.add_argument("--gpus", type=int, default=8, help="simulated GPUs per node")
    parser.add_argument("--sample-interval", type=float, default=1.0, metavar="SECONDS")
    parser.add_argument("--simulated-boot", type=float, default=DEFAULT_SIMULATED_BOOT_S,
                        metavar="SECONDS", help="how long a node the server reboots stays down")
    parser.add_argument("--slurm-state", metavar="FILE",
                        help="the simulated Slurm's state (agent/sim/workload.py): the nodes "
                             "run its jobs and report their ends (default: no jobs)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    args.workload = WorkloadFile(args.slurm_state) if args.slurm_state else None
    if args.token is not None:
        parser.error(f"--token: {TOKEN_ON_ARGV}")
    try:
        check_server(args.server, insecure=args.insecure)
        args.token = read_join_token(args.token_file)
        args.tls = tls_context(args.server, None)
    except ConfigError as exc:
        parser.error(str(exc))
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    names = [args.names.format(n) for n in range(args.first, args.first + args.count)]
    try:
        built = [build_client(name, args) for name in names]
    except InjectSpecError as exc:
        print(f"fleet: {exc}", file=sys.stderr)
        return 2
    print(f"fleet: {len(built)} simulated nodes x {args.gpus} GPUs -> {args.server}", flush=True)
    try:
        asyncio.run(run_fleet([client for client, _ in built]))
    finally:
        for _, outbox in built:
            outbox.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
