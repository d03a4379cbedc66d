"""How much CPU the node agent uses: the real agent process (`python -m agent
--simulate`, 8 GPUs, one sample a second; or `--nvml`: the machine's real GPUs through
NVML) against a local sink server, for N seconds.

    .venv/bin/python bench/agent_cpu.py [--seconds 60] [--gpus 8]
    python3 bench/agent_cpu.py --nvml [--seconds 60]      # on a machine with NVIDIA GPUs

Prints the agent process's CPU time as a percent of one core (target: under 0.5 %),
the samples the sink received, and the time one sample takes to collect and encode
(measured in this process on the same code). The sink runs in this process and is not
counted.

It also measures the floor: what waking once a second costs on this machine whatever the
program does, as a Python asyncio loop that sleeps a second and encodes one sample frame.
On a virtual machine whose caches go cold within a second, the floor alone can be over the
target (bench/README.md)."""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agent.connection import protocol  # noqa: E402
from agent.sim.backend import SimulatedBackend  # noqa: E402
from agent.node_metrics import NodeMetrics  # noqa: E402

WARM_UP_S = 5.0  # imports and the first connection are not what we measure

FLOOR_PROGRAM = """
import asyncio
from agent.connection import protocol
from agent.sim.backend import SimulatedBackend

async def main():
    gpus = SimulatedBackend("floor", gpu_count=8).read_gpus()
    frame = protocol.sample_frame(seq=0, gpus=gpus, node={})
    while True:
        await asyncio.sleep(1)
        protocol.encode(frame)

asyncio.run(main())
"""
TARGET_PCT = 0.5


class Sink:
    """Answers hello with welcome and config, acks events, counts samples."""

    def __init__(self):
        self.samples = 0
        self.bytes = 0

    async def handle(self, ws):
        try:
            await self.read(ws)
        except ConnectionClosed:
            pass

    async def read(self, ws):
        async for message in ws:
            frame = json.loads(message)
            if frame["type"] == "sample":
                self.samples += 1
                self.bytes += len(message)
            elif frame["type"] == "hello":
                await ws.send(
                    json.dumps(
                        {
                            "type": "welcome",
                            "node_id": 1,
                            "node_token": "bench-node-token",
                            "sample_interval_s": 1.0,
                        }
                    )
                )
                await ws.send(
                    json.dumps({"type": "config", "sample_interval_s": 1.0, "startup_scripts": []})
                )
            elif frame["type"] == "event":
                await ws.send(json.dumps({"type": "ack", "ids": [frame["id"]]}))


async def measure_agent(seconds, gpus, nvml):
    backend_args = [] if nvml else ["--simulate", "--gpus", str(gpus)]
    sink = Sink()
    async with serve(sink.handle, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        with tempfile.TemporaryDirectory() as state_dir:
            agent = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "agent",
                    "--server",
                    f"ws://127.0.0.1:{port}/ws/agent/",
                    *backend_args,
                    "--node-name",
                    "bench-node",
                    "--state-dir",
                    state_dir,
                ],
                cwd=REPO,
                env={**os.environ, "CLUSTERUI_AGENT_TOKEN": "bench-join-token"},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                cpu, wall, rss, samples = await measure_process(
                    agent, seconds, count=lambda: sink.samples)
            finally:
                agent.terminate()
                agent.wait(timeout=10)
    return cpu, wall, samples, sink.bytes / max(sink.samples, 1), rss


async def measure_process(child, seconds, count=lambda: 0):
    """(CPU seconds, wall seconds, RSS bytes, what `count` counted) of a running child
    process over `seconds`, after the warm-up."""
    process = psutil.Process(child.pid)
    await asyncio.sleep(WARM_UP_S)
    if child.poll() is not None:
        sys.exit(f"{child.args[:3]} exited early with code {child.returncode}")
    cpu_before, counted_before = _cpu_seconds(process), count()
    started = time.monotonic()
    await asyncio.sleep(seconds)
    wall = time.monotonic() - started
    return (_cpu_seconds(process) - cpu_before, wall, process.memory_info().rss,
            count() - counted_before)


async def measure_floor(seconds):
    """CPU % of one core of FLOOR_PROGRAM: what waking once a second costs here."""
    child = subprocess.Popen([sys.executable, "-c", FLOOR_PROGRAM], cwd=REPO)
    try:
        cpu, wall, _, _ = await measure_process(child, seconds)
    finally:
        child.terminate()
        child.wait(timeout=10)
    return 100 * cpu / wall


def _cpu_seconds(process):
    """CPU time of the process's threads, to the nanosecond from the scheduler's
    /proc/PID/task/*/schedstat where there is one (Linux); else psutil's, which the
    kernel may count in whole 10 ms ticks."""
    try:
        total_ns = 0
        for thread in os.listdir(f"/proc/{process.pid}/task"):
            with open(f"/proc/{process.pid}/task/{thread}/schedstat") as f:
                total_ns += int(f.read().split()[0])
        return total_ns / 1e9
    except OSError:
        times = process.cpu_times()
        return times.user + times.system


def measure_collection(gpus, nvml, rounds=2000):
    """Seconds to collect and encode one sample: what the agent does every second."""
    if nvml:
        from agent.backends.nvml import NvmlBackend

        backend = NvmlBackend()
        backend.wait_ready(timeout_s=5.0)  # PCIe throughput has its own thread
    else:
        backend = SimulatedBackend("bench-node", gpu_count=gpus)
    node_metrics = NodeMetrics()
    durations = []
    for seq in range(rounds):
        started = time.perf_counter()
        frame = protocol.sample_frame(seq=seq, gpus=backend.read_gpus(), node=node_metrics.read())
        protocol.encode(frame)
        durations.append(time.perf_counter() - started)
    backend.close()
    durations.sort()
    return statistics.median(durations), durations[int(len(durations) * 0.99)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--gpus", type=int, default=8, help="simulated GPUs")
    parser.add_argument("--nvml", action="store_true", help="the real GPUs, through NVML")
    args = parser.parse_args()

    cores = f"{os.cpu_count()} cores ({psutil.cpu_count(logical=False)} physical)"
    print(f"machine: {cores}, {sys.platform}")
    backend = "NVML (real GPUs)" if args.nvml else f"--simulate --gpus {args.gpus}"
    print(
        f"agent: {backend}, 1 sample/s, {args.seconds:g} s measured "
        f"after {WARM_UP_S:g} s warm-up"
    )
    cpu, wall, samples, sample_bytes, rss = asyncio.run(
        measure_agent(args.seconds, args.gpus, args.nvml))
    median, p99 = measure_collection(args.gpus, args.nvml)
    floor = asyncio.run(measure_floor(args.seconds))
    percent = 100 * cpu / wall

    print(f"samples received: {samples} in {wall:.1f} s ({sample_bytes:.0f} bytes each)")
    print(
        f"agent CPU: {cpu:.3f} s in {wall:.1f} s = {percent:.3f} % of one core "
        f"(target < {TARGET_PCT} %)"
    )
    print(f"agent memory: {rss / 2**20:.1f} MiB resident")
    print(f"collect + encode one sample: median {median * 1e6:.0f} us, p99 {p99 * 1e6:.0f} us")
    print(f"floor (an asyncio loop that wakes every second and encodes one sample): "
          f"{floor:.3f} % of one core; the agent above it: {percent - floor:.3f} %")
    print("PASS" if percent < TARGET_PCT else "FAIL: over target")
    return 0 if percent < TARGET_PCT else 1


if __name__ == "__main__":
    sys.exit(main())
