"""`python -m agent`: read the settings, pick the backend, then either print one hello
and one sample (--print-once) or run the client until SIGTERM/SIGINT.
`python -m agent hook job-start|job-end` is Slurm's Prolog/Epilog (agent/hook.py).

Exit codes: 0 done, 2 a usage error or no NVIDIA driver (the message says which)."""

import argparse
import asyncio
import logging
import os
import signal
import sys
import time

from agent import __version__, host
from agent.backends import BackendUnavailable
from agent.config import (
    TOKEN_ENVIRONMENT,
    TOKEN_ON_ARGV,
    ConfigError,
    build_config,
    read_config_file,
    tls_context,
)
from agent.connection import protocol
from agent.connection.client import AgentClient
from agent.connection.node_token import read_node_token
from agent.connection.outbox import Outbox
from agent.node import build_node

log = logging.getLogger("agent")

OUTBOX_FILE = "outbox.sqlite3"
PRINT_ONCE_WINDOW_S = 0.25  # how long --print-once measures CPU and network rates


def make_parser():
    parser = argparse.ArgumentParser(
        prog="python -m agent",
        description="clusterui node agent: reports this node's GPUs to the clusterui server.",
    )
    parser.add_argument("--server", help="the server's agent endpoint, wss://HOST/ws/agent/")
    parser.add_argument(
        "--token-file", metavar="FILE",
        help="a file holding the join token (used until the server issues a node token); "
             "or token in --config, or the CLUSTERUI_AGENT_TOKEN environment variable",
    )
    parser.add_argument("--token", help=argparse.SUPPRESS)  # refused: see TOKEN_ON_ARGV
    parser.add_argument("--ca-file", metavar="FILE",
                        help="the CA certificates a wss:// server's certificate is checked "
                             "against (default: the system's)")
    parser.add_argument("--insecure", action="store_true", default=None,
                        help="allow ws:// to another machine (plaintext: a test network only)")
    parser.add_argument("--config", metavar="FILE", help="TOML file with the same keys")
    parser.add_argument(
        "--state-dir", help="node token and event outbox (default /var/lib/clusterui-agent)"
    )
    parser.add_argument("--node-name", help="this node's name (default: the short hostname)")
    parser.add_argument("--outbox-max-mb", type=float, metavar="MB",
                        help="the event outbox's size on disk; past it the oldest info events "
                             "go first (default 64)")
    parser.add_argument(
        "--sample-interval",
        type=float,
        metavar="SECONDS",
        help="seconds between samples (default 1.0; the server's setting wins)",
    )
    parser.add_argument(
        "--throttle-hold",
        type=float,
        metavar="SECONDS",
        help="how long throttling must hold before it is an event (default 10)",
    )
    parser.add_argument(
        "--kmsg",
        metavar="PATH",
        help="the kernel log read for Xid lines (default /dev/kmsg)",
    )
    parser.add_argument(
        "--reboot-command",
        metavar="CMD",
        help="run for the server's reboot command (default: systemctl reboot)",
    )
    parser.add_argument(
        "--simulate",
        action="store_true",
        default=None,
        help="simulated GPUs replaying a real H200 trace instead of NVML",
    )
    parser.add_argument("--gpus", type=int, metavar="N", help="simulated GPUs (default 8)")
    parser.add_argument(
        "--inject",
        action="append",
        metavar="SPEC",
        help="simulated faults, e.g. xid:79@30s,thermal@60s+30s:gpu2,gpu_lost@90s",
    )
    parser.add_argument(
        "--simulated-boot",
        type=float,
        metavar="SECONDS",
        help="with --simulate: how long a reboot keeps the node down (default 5)",
    )
    add_hygiene_options(parser)
    parser.add_argument(
        "--print-once",
        action="store_true",
        default=None,
        help="print one hello and one sample as JSON lines and exit, without connecting",
    )
    parser.add_argument("-v", "--verbose", action="store_true", default=None, help="debug logs")
    parser.add_argument("--version", action="version", version=f"clusterui-agent {__version__}")
    return parser


def add_hygiene_options(parser):
    """Node hygiene's options (agent.config.HYGIENE_KEYS); the hook takes them too."""
    group = parser.add_argument_group("node hygiene (Slurm nodes; agent/README.md)")
    on_off = argparse.BooleanOptionalAction
    group.add_argument("--hygiene", action=on_off, default=None,
                       help="node hygiene at all (default on where scontrol exists)")
    group.add_argument("--slurmd-restart", action=on_off, default=None,
                       help="restart a dead slurmd in place (default on)")
    group.add_argument("--slurmd-restart-command", metavar="CMD",
                       help="how (default: systemctl restart UNIT, or slurmd -N NODE)")
    group.add_argument("--slurmd-pid-file", metavar="FILE",
                       help="slurmd's pid file where systemd does not run it (default: "
                            "scontrol show config's SlurmdPidFile)")
    group.add_argument("--slurmd-unit", metavar="NAME", help="its systemd unit (slurmd)")
    group.add_argument("--slurmd-flap-count", type=int, metavar="N",
                       help="restarts within the flap window that open slurmd_flapping (3)")
    group.add_argument("--slurmd-flap-window", type=float, metavar="SECONDS",
                       help="the flap window (600)")
    group.add_argument("--zombie-threshold", type=int, metavar="N",
                       help="zombies that open zombie_processes (10)")
    group.add_argument("--pid-pressure-pct", type=float, metavar="PCT",
                       help="tasks, as %% of pid_max, that open pid_pressure (80)")
    group.add_argument("--process-check-interval", type=float, metavar="SECONDS",
                       help="how often the process table is read for zombies, orphans and "
                            "PID usage (30)")
    group.add_argument("--job-cleanup-grace", type=float, metavar="SECONDS",
                       help="at job end, from SIGTERM to SIGKILL for a job's leftovers (10)")
    group.add_argument("--slurm-cgroup-root", metavar="DIR",
                       help="where Slurm's cgroup v2 job_<id> folders are (default "
                            "/sys/fs/cgroup/system.slice/slurmstepd.scope)")
    group.add_argument("--shm-dir", metavar="DIR", help="shared memory (/dev/shm)")
    group.add_argument("--gres-conf", metavar="FILE",
                       help="gres.conf (default: beside $SLURM_CONF, else /etc/slurm)")
    group.add_argument("--gpu-device-dir", metavar="DIR",
                       help="where the nvidiaN device files are (/dev)")
    group.add_argument("--gres-check-interval", type=float, metavar="SECONDS",
                       help="how often Slurm's GPUs are compared with NVML's (300)")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["hook"]:  # Slurm's Prolog / Epilog (agent/hook.py)
        from agent.hook import main as hook_main

        return hook_main(argv[1:])
    if argv[:1] == ["install"]:  # the console's install command (agent/install.py)
        from agent.install import main as install_main

        return install_main(argv[1:])
    parser = make_parser()
    args = parser.parse_args(argv)
    options = vars(args)
    if options.pop("token") is not None:
        parser.error(f"--token: {TOKEN_ON_ARGV}")
    config_path = options.pop("config")
    try:
        file_values = read_config_file(config_path) if config_path else {}
        config = build_config(options, file_values)
        tls = tls_context(config.server, config.ca_file) if config.server else None
    except ConfigError as exc:
        parser.error(str(exc))  # exits 2

    logging.basicConfig(
        level=logging.DEBUG if config.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        node = make_node(config)
    except BackendUnavailable as exc:
        return _fail(str(exc))
    except OSError as exc:
        return _fail(f"cannot read the boot id from {host.BOOT_ID_PATH}: {exc.strerror}")

    try:
        if config.print_once:
            return print_once(node)
        return run_agent(config, node, tls)
    finally:
        node.close()


def make_node(config):
    """The node the agent reports (agent.node.Node, not started): simulated with
    --simulate (agent/sim), else this machine's. The one place the agent chooses."""
    if config.simulate:
        from agent.sim import build_simulated_node

        return build_simulated_node(config)
    return build_node(config)


def print_once(node):
    backend = node.backend
    backend.wait_ready(timeout_s=2.0)
    time.sleep(PRINT_ONCE_WINDOW_S)
    hello = protocol.hello_frame(
        node=node.name,
        boot_id=node.boot_id,
        agent_version=__version__,
        driver_version=backend.driver_version,
        cuda_version=backend.cuda_version,
        gpus=backend.gpus(),
        slurm=node.read_slurm(node.name),
    )
    sample = protocol.sample_frame(seq=0, gpus=backend.read_gpus(), node=node.node_metrics.read())
    print(protocol.encode(hello))
    print(protocol.encode(sample))
    return 0


def run_agent(config, node, tls=None):
    try:
        os.makedirs(config.state_dir, mode=0o700, exist_ok=True)
        node_token = read_node_token(config.state_dir)
    except OSError as exc:
        return _fail(f"cannot use the state dir {config.state_dir}: {exc.strerror}")
    if not config.token and not node_token:
        return _fail(
            f"no token: give a join token with --token-file, token in --config, or "
            f"{TOKEN_ENVIRONMENT}; {config.state_dir} holds no node token yet"
        )

    outbox = Outbox(os.path.join(config.state_dir, OUTBOX_FILE),
                    max_bytes=int(config.outbox_max_mb * 2**20))
    node.start()
    client = AgentClient(config, node, outbox=outbox, node_token=node_token, tls=tls)
    log.info(
        "clusterui-agent %s: node %s, %d %s GPUs, server %s, %d events in the outbox",
        __version__,
        config.node_name,
        len(node.backend.gpus()),
        node.kind,
        config.server,
        len(outbox),
    )
    try:
        asyncio.run(_run_until_signalled(client))
    finally:
        outbox.close()
    return 0


async def _run_until_signalled(client):
    """Run the client; SIGTERM (systemd stop) or SIGINT (Ctrl-C) ends it cleanly."""
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, task.cancel)
    try:
        await client.run()
    except asyncio.CancelledError:
        log.info("stopping")


def _fail(message):
    print(f"clusterui-agent: {message}", file=sys.stderr)
    return 2
