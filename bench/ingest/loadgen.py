"""The load generator: N simulated agents in one process (asyncio + websockets).

    python bench/ingest/loadgen.py --fleet FLEET.json --ports 8001[,8002] [--connections 2000]

Each connection says hello with its node's 8 simulated H200s (agent/sim/backend.py),
waits for the welcome, then sends samples built with agent/connection/protocol.py's frame builders
(real H200 readings, ~2.1 KB each). One pacer sends them at a target aggregate rate,
round-robin over the connections, so every node reports at rate/N per second, evenly spaced.

Commands on stdin, one JSON answer per line on stdout:
  rate R    send R samples per second in all from now on (0 pauses)
  stats     {"sent", "skipped", "lost", "errors", "open", "cpu_s"} so far
  quit      close the connections and exit

Cheap on purpose, so that it outruns the server on the other core: a frame's JSON is
re-encoded with fresh readings every REFRESH_S per connection; in between only `seq` and
`ts` (the send time) change, spliced into the encoded text. A connection whose socket
buffer is full (the server stopped reading) is skipped and the frame counted as
`skipped`: an offered frame that was never delivered.
"""

import argparse
import asyncio
import functools
import json
import os
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from websockets.asyncio.client import connect  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402

from agent.connection import protocol  # noqa: E402
from agent.connection.client import retry_after  # noqa: E402
from agent.sim import backend as simulated  # noqa: E402
from agent.node_metrics import NodeMetrics  # noqa: E402

# 2,000 backends would each parse the same trace file: parse it once.
simulated.load_fixture = functools.lru_cache(maxsize=None)(simulated.load_fixture)

REFRESH_S = 5.0
SEQ_MARK = 987654321987  # placeholders, spliced out of the encoded frame
TS_MARK = 1234567890.125
WRITE_BUFFER_LIMIT = 256 * 1024  # a connection with more unsent bytes than this is skipped
PACE_EVERY_S = 0.005
SETUP_CONCURRENCY = 32


class Agent:
    def __init__(self, node, token, url, node_metrics):
        self.node = node
        self.token = token
        self.url = url
        self.backend = simulated.SimulatedBackend(node)
        self.node_metrics = node_metrics
        self.ws = None
        self.hellos_again = 0  # hellos answered rate_limited or server_error, said again
        self.seq = 0
        self.parts = None
        # Re-encodings spread evenly over REFRESH_S, not all 2,000 in one burst.
        self.built_at = time.monotonic() - REFRESH_S * random.random()
        self.errors = 0

    async def start(self, compression, open_timeout=300, welcome_timeout=None):
        """Connect and say hello; wait for the welcome (welcome_timeout, by default
        open_timeout), from each answer that asks for the hello again."""
        welcome_timeout = welcome_timeout or open_timeout
        self.ws = await connect(
            self.url,
            additional_headers={"Authorization": f"Bearer {self.token}"},
            compression=compression,
            max_size=2**20,
            ping_interval=None,  # the server pings; answering is automatic
            open_timeout=open_timeout,
            close_timeout=2,
        )
        hello = protocol.hello_frame(
            node=self.node, boot_id="bench-boot", agent_version="bench",
            driver_version=self.backend.driver_version, cuda_version=self.backend.cuda_version,
            gpus=self.backend.gpus(), slurm=None,
        )
        await self.ws.send(protocol.encode(hello))
        async with asyncio.timeout(welcome_timeout) as welcome_due:
            while True:
                frame = json.loads(await self.ws.recv())
                if frame["type"] == "welcome":
                    break
                if frame["type"] == "error" and frame.get("code") in ("server_error",
                                                                      "rate_limited"):
                    # As agent.connection.client does: the same hello again on this connection.
                    self.hellos_again += 1
                    await asyncio.sleep(retry_after(frame))
                    await self.ws.send(protocol.encode(hello))
                    welcome_due.reschedule(asyncio.get_running_loop().time() + welcome_timeout)
        asyncio.get_running_loop().create_task(self.read())

    async def read(self):
        """Answers come rarely (config, errors); websockets answers pings by itself."""
        try:
            async for message in self.ws:
                if '"error"' in message:
                    self.errors += 1
                    if self.errors <= 3:
                        print(f"loadgen: {self.node}: {message[:200]}", file=sys.stderr)
        except ConnectionClosed:
            pass

    def frame(self, now_mono):
        if self.parts is None or now_mono - self.built_at >= REFRESH_S:
            text = protocol.encode(protocol.sample_frame(
                seq=SEQ_MARK, ts=TS_MARK, gpus=self.backend.read_gpus(),
                node=self.node_metrics))
            head, rest = text.split(str(SEQ_MARK))
            middle, tail = rest.split(repr(TS_MARK))
            self.parts = (head, middle, tail)
            self.built_at = now_mono
        self.seq += 1
        head, middle, tail = self.parts
        return f"{head}{self.seq}{middle}{time.time()!r}{tail}"

    def send_now(self, text):
        """Queue one text frame without awaiting: False if the connection cannot take it."""
        ws = self.ws
        if ws.transport.get_write_buffer_size() > WRITE_BUFFER_LIMIT:
            return False
        ws.protocol.send_text(text.encode())
        ws.send_data()
        return True


def frame_bytes(agent):
    size = len(agent.frame(time.monotonic()))
    agent.seq -= 1  # not sent
    return size


class LoadGen:
    def __init__(self, agents):
        self.agents = agents
        self.rate = 0.0
        self.sent = self.skipped = self.lost = 0

    async def pace(self):
        agents, n = self.agents, len(self.agents)
        index = 0
        start, issued, rate = time.monotonic(), 0, self.rate
        while True:
            await asyncio.sleep(PACE_EVERY_S)
            if self.rate != rate:  # a new rate starts counting from now
                start, issued, rate = time.monotonic(), 0, self.rate
            now = time.monotonic()
            due = int((now - start) * rate) - issued
            for _ in range(due):
                agent = agents[index]
                index = (index + 1) % n
                if agent.ws.state.name != "OPEN":
                    self.lost += 1
                elif agent.send_now(agent.frame(now)):
                    self.sent += 1
                else:
                    self.skipped += 1
            issued += max(due, 0)

    def stats(self):
        times = os.times()
        return {
            "sent": self.sent, "skipped": self.skipped, "lost": self.lost,
            "errors": sum(a.errors for a in self.agents),
            "open": sum(1 for a in self.agents if a.ws.state.name == "OPEN"),
            "cpu_s": times.user + times.system, "at": time.time(),
        }


async def commands(loadgen, pacer):
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := (await reader.readline()).decode().strip():
        word, _, arg = line.partition(" ")
        if word == "rate":
            loadgen.rate = float(arg)
            answer = {"rate": loadgen.rate, "at": time.time()}
        elif word == "stats":
            answer = loadgen.stats()
        elif word == "quit":
            break
        else:
            answer = {"error": f"unknown command {line!r}"}
        print(json.dumps(answer), flush=True)
    pacer.cancel()
    await asyncio.gather(*(a.ws.close() for a in loadgen.agents), return_exceptions=True)


async def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleet", required=True, help="JSON: [{node, token}, ...]")
    parser.add_argument("--ports", required=True, help="server ports; connections alternate")
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--compression", choices=["none", "deflate"], default="none")
    args = parser.parse_args()

    fleet = json.loads(Path(args.fleet).read_text())["nodes"][: args.connections]
    ports = [int(p) for p in args.ports.split(",")]
    node_metrics = NodeMetrics()
    await asyncio.sleep(0.2)
    node_metrics = node_metrics.read()  # one real reading, the same in every sample
    agents = [Agent(entry["node"], entry["token"],
                    f"ws://127.0.0.1:{ports[i % len(ports)]}/ws/agent/", node_metrics)
              for i, entry in enumerate(fleet)]

    compression = None if args.compression == "none" else "deflate"
    limit = asyncio.Semaphore(SETUP_CONCURRENCY)
    started = time.monotonic()

    async def start(agent):
        async with limit:
            await agent.start(compression)

    await asyncio.gather(*(start(a) for a in agents))
    loadgen = LoadGen(agents)
    print(json.dumps({"ready": len(agents), "setup_s": round(time.monotonic() - started, 1),
                      "frame_bytes": frame_bytes(agents[0])}), flush=True)
    pacer = asyncio.get_running_loop().create_task(loadgen.pace())
    await commands(loadgen, pacer)


if __name__ == "__main__":
    asyncio.run(main())
