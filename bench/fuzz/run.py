"""The fuzz run: hostile frames of every type against one daphne and PostgreSQL.

    bench/fuzz/run.sh [--frames 10000] [--seed N] [--types hello,event,...]

Production mode (bench/fuzz/run.sh: a throwaway PostgreSQL and Redis), one daphne on core 0,
this driver on core 1 as one node with a node token, the rate limits set out of reach (so
every frame is read exactly; bench/flood measures the limits). For each frame type it
sends --frames fuzzed frames (bench/fuzz/frames.py: each followed by a normal event that must be acked, no
answer server_error, every event answered, closes only where PROTOCOL.md says) and prints
what came back. It stops at the first breach, printing the frame, and counts the tracebacks
in daphne's log (each one a frame a handler failed on).
"""

import argparse
import asyncio
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import websockets

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
sys.path.insert(0, str(REPO))

from bench.fuzz.frames import FRAME_TYPES, Closed, Tally, fuzz  # noqa: E402
from bench.ingest import run as ingest  # noqa: E402
from bench.storm import run as storm  # noqa: E402

GPU_UUIDS = [f"GPU-fuzz-{i}" for i in range(8)]


class Connection:
    """One agent connection over a real socket, welcomed."""

    def __init__(self, ws):
        self.ws = ws

    @classmethod
    async def open(cls, url, token, node):
        ws = await websockets.connect(url, additional_headers={"Authorization": f"Bearer {token}"},
                                      max_size=None, ping_interval=None, close_timeout=2)
        connection = cls(ws)
        gpus = [{"index": i, "uuid": u, "name": "NVIDIA H200"} for i, u in enumerate(GPU_UUIDS)]
        await ws.send(json.dumps({"type": "hello", "node": node, "boot_id": "fuzz-boot",
                                  "agent_version": "fuzz", "gpus": gpus}))
        while (await connection.receive())["type"] != "config":
            pass  # welcome, then config
        return connection

    async def send(self, text):
        try:
            await self.ws.send(text)
        except websockets.ConnectionClosed as exc:
            raise Closed(exc.rcvd.code if exc.rcvd else None) from None

    async def receive(self):
        try:
            return json.loads(await asyncio.wait_for(self.ws.recv(), 30))
        except websockets.ConnectionClosed as exc:
            raise Closed(exc.rcvd.code if exc.rcvd else None) from None

    async def close(self):
        await self.ws.close()


async def run(args, entry, port):
    url = f"ws://127.0.0.1:{port}/ws/agent/"
    results = []
    for frame_type in args.types:
        tally = Tally()
        started = time.monotonic()
        await fuzz(lambda: Connection.open(url, entry["token"], entry["node"]), frame_type,
                   args.frames, seed=f"{args.seed}-{frame_type}", node=entry["node"],
                   gpu_uuids=GPU_UUIDS, tally=tally)
        seconds = time.monotonic() - started
        results.append({"type": frame_type, "frames": tally.frames,
                        "probes_acked": tally.probes_acked, "connections": tally.connections,
                        "closes": tally.closes, "answers": tally.answers,
                        "seconds": round(seconds, 1)})
        storm.log(f"{frame_type}: {tally.frames} frames in {seconds:.0f} s, answers "
                  f"{tally.answers}, closes {tally.closes}")
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=10_000, help="fuzzed frames a type")
    parser.add_argument("--seed", default=str(int(time.time())))
    parser.add_argument("--types", default=",".join(FRAME_TYPES),
                        type=lambda text: text.split(","))
    args = parser.parse_args()
    workdir = Path(os.environ.get("BENCH_WORKDIR") or "/tmp")
    subprocess.run([PY, "manage.py", "migrate", "-v0"], cwd=REPO, check=True, timeout=600)
    fleet_path = workdir / "fleet.json"
    subprocess.run([PY, str(REPO / "bench" / "ingest" / "fleet.py"), "--nodes", "1",
                    "--out", str(fleet_path)], cwd=REPO, check=True, timeout=600)
    entry = storm.prepare(fleet_path, join=0)["nodes"][0]
    port = ingest.free_port()
    log_path = workdir / "daphne.log"
    # The rate limits off (bench/flood measures them): every fuzzed frame is read exactly.
    unlimited = {name: "1000000000" for name in (
        "CLUSTERUI_AGENT_FRAMES_PER_S", "CLUSTERUI_AGENT_FRAME_BURST",
        "CLUSTERUI_AGENT_NEW_EVENTS_PER_HOUR", "CLUSTERUI_AGENT_OPEN_EVENTS_MAX")}
    with open(log_path, "w") as log_file:
        server = subprocess.Popen(ingest.pinned(0, storm.server_argv("daphne", port)), cwd=REPO,
                                  env={**os.environ, **unlimited},
                                  stdout=log_file, stderr=subprocess.STDOUT)
    try:
        ingest.wait_for_port(port, server)
        rss_before = psutil.Process(server.pid).memory_info().rss
        results = asyncio.run(run(args, entry, port))
        rss_after = psutil.Process(server.pid).memory_info().rss
    finally:
        server.terminate()
        server.wait(15)
    tracebacks = log_path.read_text().count("Traceback")
    print()
    print(f"fuzz run, {datetime.date.today()}, {os.cpu_count()} cores, production mode, "
          f"daphne x1, seed {args.seed}")
    print(" ".join(sys.argv))
    for result in results:
        print(json.dumps(result))
    print(json.dumps({"tracebacks_in_server_log": tracebacks,
                      "server_rss_mb": [round(rss_before / 2**20), round(rss_after / 2**20)]}))
    (workdir / "results.json").write_text(json.dumps(
        {"argv": sys.argv, "seed": args.seed, "results": results, "tracebacks": tracebacks},
        indent=1))


if __name__ == "__main__":
    main()
