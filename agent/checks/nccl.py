"""nccl: all-reduce bus bandwidth across the node's GPUs, measured by nccl-tests.

Runs `all_reduce_perf -b 8 -e 1G -f 2 -g <GPUs>` (one process driving every GPU; sizes
8 B to 1 GiB, doubling) and reads its summary line `# Avg bus bandwidth : <GB/s>`:
the mean of the bus bandwidth over every size, small ones included, so a baseline must
come from the same command. The binary is the one configured for the agent
(CheckRunner's all_reduce_perf) or the first on PATH.

Verdict: failed when all_reduce_perf reports values out of bounds (wrong results) or a
row with #wrong above 0, or when the average is below `min_busbw_gbps`."""

import os
import re
import shutil
import subprocess

from agent.checks import CheckError, failed, passed
from agent.checks.params import Param
from agent.checks.params import read_params as read_spec

NOT_INSTALLED = "nccl-tests (all_reduce_perf) is not installed on this node"
ARGUMENTS = ["-b", "8", "-e", "1G", "-f", "2"]
TIME_LIMIT_S = 600.0
OUTPUT_TAIL_CHARS = 2000

PARAMS = {
    "min_busbw_gbps": Param("number", minimum=0, help="the least average bus bandwidth, GB/s"),
}

_AVERAGE = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)", re.MULTILINE)
_OUT_OF_BOUNDS = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)", re.MULTILINE)


def read_params(params):
    return read_spec(params, PARAMS)


def time_limit_s(params, gpu_count):
    return TIME_LIMIT_S


def parse_all_reduce_perf(output):
    """The figures of one all_reduce_perf run's output, or None when it has no
    `Avg bus bandwidth` line. Each result row ends with the out-of-place then the
    in-place columns `time algbw busbw #wrong`, so busbw is read from the end of the
    row (older versions lack the root column). Lines that are not rows (NCCL or MPI
    messages mixed in) are skipped."""
    averages = _AVERAGE.findall(output)
    if not averages:
        return None
    out_of_bounds = _OUT_OF_BOUNDS.findall(output)
    rows = []
    for line in output.splitlines():
        fields = line.split()
        if len(fields) < 12 or line.lstrip().startswith("#") or not fields[0].isdigit():
            continue
        try:
            row = {
                "bytes": int(fields[0]),
                "busbw_out_of_place": float(fields[-6]),
                "busbw_in_place": float(fields[-2]),
            }
        except ValueError:
            continue
        row["wrong"] = sum(_count(field) for field in (fields[-5], fields[-1]))
        rows.append(row)
    return {
        "avg_busbw_gbps": float(averages[-1]),
        "max_busbw_gbps": max(
            (max(row["busbw_out_of_place"], row["busbw_in_place"]) for row in rows), default=None
        ),
        "largest_bytes": max((row["bytes"] for row in rows), default=None),
        "sizes": len(rows),
        "wrong_rows": sum(1 for row in rows if row["wrong"] > 0),
        "out_of_bounds": int(out_of_bounds[-1]) if out_of_bounds else None,
    }


def _count(field):
    """A #wrong column: a count in current nccl-tests; older ones print the largest
    error as a float (0e+00), which is not a count and is not judged."""
    return int(field) if field.isdigit() else 0


def decide(measurements, params, inventory):
    """measurements: parse_all_reduce_perf's figures, with "gpus" (how many ran)."""
    metrics = dict(measurements)
    problems = []
    if measurements["out_of_bounds"]:
        problems.append(
            f"all_reduce_perf found {measurements['out_of_bounds']} values out of bounds "
            f"(wrong results)"
        )
    if measurements["wrong_rows"]:
        problems.append(
            f"all_reduce_perf found wrong results at {measurements['wrong_rows']} sizes"
        )
    minimum = params["min_busbw_gbps"]
    average = measurements["avg_busbw_gbps"]
    if minimum is not None and average < minimum:
        problems.append(f"average bus bandwidth {average:g} GB/s, below the minimum {minimum:g}")
    if problems:
        return failed(metrics, problems)
    if minimum is None:
        return passed(metrics, "measured; no baseline given")
    return passed(
        metrics,
        f"average bus bandwidth {average:g} GB/s across {measurements['gpus']} GPUs: at or "
        f"above the minimum {minimum:g}",
    )


# The child process


def find_all_reduce_perf(configured):
    if configured:
        if not (os.path.isfile(configured) and os.access(configured, os.X_OK)):
            raise CheckError(f"{NOT_INSTALLED}: {configured} is not an executable file")
        return configured
    found = shutil.which("all_reduce_perf")
    if found is None:
        raise CheckError(NOT_INSTALLED)
    return found


def measure(request):
    binary = find_all_reduce_perf(request.get("all_reduce_perf"))
    gpu_count = len(request["gpus"])
    if gpu_count < 2:
        raise CheckError(
            f"an all-reduce needs at least 2 GPUs; the agent lists {gpu_count} on this node"
        )
    argv = [binary, *ARGUMENTS, "-g", str(gpu_count)]
    completed = subprocess.run(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    )
    figures = parse_all_reduce_perf(completed.stdout)
    if figures is None:
        tail = completed.stdout[-OUTPUT_TAIL_CHARS:].strip()
        raise CheckError(
            f"{' '.join(argv)} exited with {completed.returncode} and printed no "
            f"'Avg bus bandwidth' line: {tail}"
        )
    return {**figures, "gpus": gpu_count, "exit_code": completed.returncode}
