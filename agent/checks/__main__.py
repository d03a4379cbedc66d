"""`python -m agent.checks`: run one check by hand, or be a check's child process.

    python -m agent.checks list
    python -m agent.checks run gpu_compute --params '{"min_tflops": 711}'
    python -m agent.checks run storage --params '{"path": "/scratch", "bytes": 4294967296}'
    python -m agent.checks run gpu_compute --simulate --inject thermal@0s:gpu2

`run` goes through the agent's CheckRunner (the same child process, time limit and
verdict as a check the server asks for) and prints the result as JSON. Exit status:
0 passed, 1 failed, 3 error, 2 a usage error.

`child <module>` is what CheckRunner starts: the request as JSON on stdin, one JSON
object on stdout."""

import argparse
import asyncio
import importlib
import json
import os
import signal
import sys
import tempfile

from agent.checks import CHECKS, CheckError

EXIT_STATUS = {"passed": 0, "failed": 1, "error": 3}


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m agent.checks", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="the checks and their params")
    run = commands.add_parser("run", help="run one check and print its result as JSON")
    run.add_argument("check", help=", ".join(CHECKS))
    run.add_argument("--params", default="{}", help="the params, a JSON object")
    run.add_argument(
        "--scratch-dir",
        default=tempfile.gettempdir(),
        help="where storage writes unless its params give a path (default: %(default)s)",
    )
    run.add_argument("--all-reduce-perf", metavar="PATH", help="nccl-tests' binary if not on PATH")
    run.add_argument("--simulate", action="store_true", help="a simulated node (no GPU needed)")
    run.add_argument("--gpus", type=int, default=8, help="simulated GPUs (default 8)")
    run.add_argument("--inject", help="simulated faults, as the agent's --inject")
    child = commands.add_parser("child", help="internal: measure for CheckRunner")
    child.add_argument("module")
    args = parser.parse_args(argv)

    if args.command == "child":
        return child_main(args.module)
    if args.command == "list":
        return list_checks()
    try:
        params = json.loads(args.params)
    except ValueError as exc:
        parser.error(f"--params is not JSON: {exc}")
    result = asyncio.run(run_one(args, params))
    print(json.dumps(result, indent=2))
    return EXIT_STATUS[result["status"]]


def list_checks():
    for name, module_name in CHECKS.items():
        module = importlib.import_module(module_name)
        print(name)
        for param_name, param in module.PARAMS.items():
            default = "" if param.default is None else f" (default {param.default})"
            print(f"    {param_name}: {param.kind}{default}  {param.help}")
    return 0


async def run_one(args, params):
    if args.simulate:
        from agent.config import parse_inject
        from agent.sim.backend import SimulatedBackend
        from agent.sim.checks import SimulatedCheckRunner

        faults = parse_inject(args.inject) if args.inject else ()
        backend = SimulatedBackend("gpu-sim", gpu_count=args.gpus, faults=faults)
        runner = SimulatedCheckRunner(backend, args.scratch_dir, duration_s=0)
        return await runner.run(args.check, params)

    from agent.checks.runner import CheckRunner

    backend = nvml_backend_or_none()
    try:
        runner = CheckRunner(
            backend or NoGpusListed(), args.scratch_dir, all_reduce_perf=args.all_reduce_perf
        )
        return await runner.run(args.check, params)
    finally:
        if backend is not None:
            backend.close()


def nvml_backend_or_none():
    """The NVML backend, for the list of GPUs a check compares with; None (said on
    stderr) where NVML cannot start: the check then measures what it finds."""
    from agent.backends import BackendUnavailable

    try:
        from agent.backends.nvml import NvmlBackend

        return NvmlBackend()
    except BackendUnavailable as exc:
        print(
            f"NVML unavailable ({exc}); the check cannot compare with NVML's GPUs",
            file=sys.stderr,
        )
        return None


class NoGpusListed:
    def gpus(self):
        return []


def child_main(module_name):
    # Keep fd 1 for the result alone: CUDA, NCCL and friends may print to stdout.
    result_fd = os.dup(1)
    os.dup2(2, 1)
    # At its time limit the runner sends SIGTERM: exit through the finally blocks
    # (storage removes its file), not at once.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    request = json.load(sys.stdin)
    module = importlib.import_module(module_name)
    try:
        result = {"measurements": module.measure(request)}
    except CheckError as exc:
        result = {"error": str(exc)}
    with os.fdopen(result_fd, "w") as out:
        out.write(json.dumps(result))
    return 0


def _exit_on_sigterm(signum, frame):
    sys.exit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
