"""`python -m agent.detectors`: run the passive detectors on this node for a while,
without a server, and print every event as one JSON line (the frame the agent would
send). For checking the detectors on a real GPU:

    sudo .venv/bin/python -m agent.detectors --seconds 60

(root, to read /dev/kmsg). stderr says which detectors run and which sources are read
(-v: also every reading of the NVML threads: remapped rows, GPU recovery action); the
exit code is 0, or 2 without an NVIDIA driver. --simulate (with --inject) runs the
simulated node instead, as a dry run."""

import argparse
import json
import logging
import sys
import time

from agent import host
from agent.backends import BackendUnavailable
from agent.config import Config, InjectSpecError, check_gpu_indexes, parse_inject
from agent.detectors import close_watchers, make_watchers
from agent.detectors.kernel_log import KMSG_PATH
from agent.detectors.throttle import THROTTLE_HOLD_S
from agent.detectors.xid import XidWatcher

log = logging.getLogger("agent.detectors")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m agent.detectors", description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0, help="how long (default 60)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--node-name", default=None, help="for scontrol (default: hostname)")
    parser.add_argument("--kmsg", default=KMSG_PATH)
    parser.add_argument("--throttle-hold", type=float, default=THROTTLE_HOLD_S)
    parser.add_argument("--simulate", action="store_true", help="the simulated node")
    parser.add_argument("--inject", default="", help="with --simulate, as for the agent")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="also each NVML reading of the threads"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )

    config = Config(
        node_name=args.node_name or host.short_hostname(),
        kmsg_path=args.kmsg,
        throttle_hold_s=args.throttle_hold,
    )
    try:
        backend, watchers = start(args, config)
    except (BackendUnavailable, InjectSpecError) as exc:
        print(f"agent.detectors: {exc}", file=sys.stderr)
        return 2

    try:
        describe(watchers)
        run(backend, watchers, args.seconds, args.interval)
    except KeyboardInterrupt:
        pass
    finally:
        close_watchers(watchers)
        backend.close()
    return 0


def start(args, config):
    """The backend and its started watchers: this machine's GPUs, or with --simulate the
    simulated node's (agent/sim)."""
    if args.simulate:
        from agent.sim.backend import SimulatedBackend
        from agent.sim.node import simulated_watchers

        faults = parse_inject(args.inject) if args.inject else []
        check_gpu_indexes(faults, 8)
        backend = SimulatedBackend(config.node_name, faults=faults)
        return backend, simulated_watchers(config, backend)
    from agent.backends.nvml import NvmlBackend

    backend = NvmlBackend()
    return backend, make_watchers(config, backend)


def describe(watchers):
    for watcher in watchers:
        what = type(watcher).__name__
        if isinstance(watcher, XidWatcher):
            what += " reading " + ", ".join(source.source for source in watcher.sources)
        log.info("running %s", what)


def run(backend, watchers, seconds, interval_s):
    """Sample as the agent does: read the GPUs, take the backend's events, poll each
    watcher with the readings; print each event as it comes."""
    started = time.monotonic()
    samples = 0
    while time.monotonic() - started < seconds:
        readings = backend.read_gpus()
        samples += 1
        events = backend.take_events()
        for watcher in watchers:
            events.extend(watcher.poll(readings))
        for event in events:
            print(json.dumps(event), flush=True)
        time.sleep(interval_s)
    log.info("%d samples of %d GPUs in %.0f s", samples, len(backend.gpus()), seconds)


if __name__ == "__main__":
    sys.exit(main())
