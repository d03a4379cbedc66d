"""What node hygiene's reading of the process table costs (agent/hygiene/): one scan for
zombies, orphans and PID usage (the agent does one every 30 s) and one walk of /proc for a
job's processes by SLURM_JOB_ID (the Epilog does one per job end), on this machine's /proc
with N extra processes started for the run (default 0, 1000 and 4000 sleepers: a busy GPU
node has a few thousand).

    .venv/bin/python bench/hygiene_scan.py [--processes 0 1000 4000] [--rounds 20]

Prints, per size: processes in /proc, the median and max scan and walk in ms, and the scan's
share of one core at the agent's 30 s cadence.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.hygiene import job_cleanup, processes  # noqa: E402

SCAN_INTERVAL_S = 30.0


def start_sleepers(count):
    """`count` sleeping processes (one shell each would double it: plain `sleep`s)."""
    return [subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(count)]


def timed(function, rounds):
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        function()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), max(times)


def measure(extra, rounds):
    sleepers = start_sleepers(extra)
    try:
        in_proc = sum(name.isdigit() for name in os.listdir("/proc"))
        scan = timed(lambda: processes.scan(running_job_ids=lambda: set()), rounds)
        walk = timed(lambda: job_cleanup.find_job_processes(
            "999999999", job_uid=os.geteuid(), cgroup_root="/nonexistent"), rounds)
    finally:
        for sleeper in sleepers:
            sleeper.kill()
        for sleeper in sleepers:
            sleeper.wait()
    return in_proc, scan, walk


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[0, 1000, 4000])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    print(f"{'extra':>6} {'in /proc':>9} {'scan p50 ms':>12} {'scan max ms':>12} "
          f"{'walk p50 ms':>12} {'walk max ms':>12} {'CPU at 30 s':>12}")
    for extra in args.processes:
        in_proc, (scan_p50, scan_max), (walk_p50, walk_max) = measure(extra, args.rounds)
        share = scan_p50 / 1000 / SCAN_INTERVAL_S * 100
        print(f"{extra:>6} {in_proc:>9} {scan_p50:>12.1f} {scan_max:>12.1f} {walk_p50:>12.1f} "
              f"{walk_max:>12.1f} {share:>11.3f}%")


if __name__ == "__main__":
    main()
