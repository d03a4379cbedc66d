"""The flood benchmark: does one node that floods the server hurt the others?

    bench/flood/run.sh [--nodes 500] [--phase-s 60]

Production mode (bench/flood/run.sh: a throwaway PostgreSQL and Redis), one daphne on core
0, the Celery workers and beat as bench/storm runs them. This driver (core 1) holds --nodes
agent connections (bench/storm's agent: samples at 1 Hz, and a warning event from each node
every --event-every-s). For --phase-s it measures their events' ack latency (send to ack)
with nobody flooding; then bench/flood/flooder.py (its own process) floods from one more
node: events near the largest size PROTOCOL.md allows (a 1,000-character message, 15.5 KiB
of detail), as fast as the socket takes them, never waiting for an answer, connecting again
at once when closed. For another --phase-s the same is measured. Printed: ack p50/p99 of
the others in both phases and their ratio, daphne's RSS (before, largest during the flood),
and what the flooder sent and got back (rate_limited, acks, closes 4429).

Targets (issue 15): the others' ack p99 at most 2x its idle value; RSS up by at most 100 MB.
"""

import argparse
import asyncio
import datetime
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
sys.path.insert(0, str(REPO))

from bench.storm import run as storm  # noqa: E402

ingest, loadgen, log, percentile = storm.ingest, storm.loadgen, storm.log, storm.percentile


class Sampler:
    """daphne's RSS, every 0.5 s."""

    def __init__(self, pid):
        self.process, self.rss = psutil.Process(pid), []

    async def run(self):
        while True:
            self.rss.append(self.process.memory_info().rss)
            await asyncio.sleep(0.5)


def latencies(tracker, since, until):
    return sorted(tracker.acked[i] - sent for i, sent in tracker.sent.items()
                  if since <= sent < until and i in tracker.acked)


def phase_figures(tracker, since, until):
    values = latencies(tracker, since, until)
    sent = sum(1 for at in tracker.sent.values() if since <= at < until)
    return {"events_sent": sent, "acked": len(values),
            "ack_p50_ms": round(percentile(values, 50) * 1000, 1) if values else None,
            "ack_p99_ms": round(percentile(values, 99) * 1000, 1) if values else None}


async def run(args, fleet, processes):
    url = f"ws://127.0.0.1:{processes.port}/ws/agent/"
    tracker = storm.Tracker()
    node_metrics = loadgen.NodeMetrics()
    await asyncio.sleep(0.2)
    node_metrics = node_metrics.read()
    entries, flooder = fleet["nodes"][:-1], fleet["nodes"][-1]
    agents = [storm.StormAgent(entry["node"], entry["token"], url, node_metrics, tracker=tracker)
              for entry in entries]
    limit = asyncio.Semaphore(loadgen.SETUP_CONCURRENCY)

    async def start(agent):
        async with limit:
            await agent.start(None)

    await asyncio.gather(*(start(agent) for agent in agents))
    pacer = storm.Pacer(agents, 1.0, random.Random(1), argparse.Namespace(new=0.3, clear=0.3))
    pacer.event_rate = len(agents) / args.event_every_s
    sampler = Sampler(processes.procs["server"].pid)
    tasks = [asyncio.ensure_future(pacer.run()), asyncio.ensure_future(sampler.run())]
    log(f"{len(agents)} agents welcomed; events at {pacer.event_rate:g}/s; warming up 10 s")
    await asyncio.sleep(10)

    idle_from = time.time()
    await asyncio.sleep(args.phase_s)
    idle_to = time.time()
    idle_rss = max(sampler.rss)
    log(f"idle: {phase_figures(tracker, idle_from, idle_to - storm.ACK_GRACE_S)}")

    flood = await asyncio.create_subprocess_exec(
        PY, str(REPO / "bench" / "flood" / "flooder.py"), "--url", url, "--token",
        flooder["token"], "--node", flooder["node"], "--seconds", str(args.phase_s + 2),
        stdout=asyncio.subprocess.PIPE)
    await asyncio.sleep(2)
    flood_from = time.time()
    rss_from = len(sampler.rss)
    await asyncio.sleep(args.phase_s)
    flood_to = time.time()
    flood_rss = max(sampler.rss[rss_from:])
    flooded = json.loads((await flood.communicate())[0].decode().strip().splitlines()[-1])
    await asyncio.sleep(storm.ACK_GRACE_S)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*(agent.ws.close() for agent in agents), return_exceptions=True)
    idle = phase_figures(tracker, idle_from, idle_to - storm.ACK_GRACE_S)
    flooding = phase_figures(tracker, flood_from, flood_to)
    return {"nodes": len(agents), "idle": idle, "flood": flooding,
            "p99_ratio": (round(flooding["ack_p99_ms"] / idle["ack_p99_ms"], 2)
                          if idle["ack_p99_ms"] and flooding["ack_p99_ms"] else None),
            "server_rss_mb": {"idle": round(idle_rss / 2**20), "flood_max": round(flood_rss / 2**20),
                              "growth": round((flood_rss - idle_rss) / 2**20)},
            **flooded}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500, help="nodes besides the flooder")
    parser.add_argument("--event-every-s", type=float, default=5.0)
    parser.add_argument("--phase-s", type=float, default=60.0)
    args = parser.parse_args()
    workdir = Path(os.environ.get("BENCH_WORKDIR") or "/tmp")
    subprocess.run([PY, "manage.py", "migrate", "-v0"], cwd=REPO, check=True, timeout=600)
    fleet_path = workdir / "fleet.json"
    subprocess.run([PY, str(REPO / "bench" / "ingest" / "fleet.py"), "--nodes",
                    str(args.nodes + 1), "--out", str(fleet_path)], cwd=REPO, check=True,
                   timeout=600)
    fleet = storm.prepare(fleet_path, join=0)
    processes = storm.Processes(workdir)
    try:
        figures = asyncio.run(run(args, fleet, processes))
    finally:
        processes.stop()
    print()
    print(f"flood bench, {datetime.date.today()}, {os.cpu_count()} cores, production mode, "
          f"daphne x1, {args.nodes} nodes + 1 flooding")
    print(" ".join(sys.argv))
    print(json.dumps(figures))
    (workdir / "results.json").write_text(json.dumps({"argv": sys.argv, **figures}, indent=1))


if __name__ == "__main__":
    main()
