"""The ceiling: a bare `websockets` server that only decodes the agents' frames.

    python bench/ingest/bare_server.py --port 8001 --redis-url redis://... [--decoder orjson]
                                       [--loop uvloop]

No Django, no Channels, no validation, no live store. It answers hello with welcome and
config (so the same load generator runs against it) and decodes every frame. For the
bench it counts the samples and the latency from each frame's `ts` to its decoding (1 ms
buckets), and every 100 ms adds both to Redis (bench:bare:recorded, bench:bare:latency_ms),
one pipeline, like the live store's flush.
"""

import argparse
import asyncio
import json
import time

import redis.asyncio
from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed

RECORDED_KEY = "bench:bare:recorded"
LATENCY_KEY = "bench:bare:latency_ms"
MAX_BUCKET_MS = 5000


class Counts:
    def __init__(self):
        self.recorded = 0
        self.latency = {}  # ms bucket -> count


def handler(loads, counts):
    welcome = json.dumps({"type": "welcome", "node_id": 1, "sample_interval_s": 1.0})
    config = json.dumps({"type": "config", "sample_interval_s": 1.0, "startup_scripts": []})

    async def handle(ws):
        try:
            async for message in ws:
                frame = loads(message)
                if frame["type"] == "sample":
                    counts.recorded += 1
                    ms = min(int((time.time() - frame["ts"]) * 1000), MAX_BUCKET_MS)
                    latency = counts.latency  # flush() swaps it
                    latency[ms] = latency.get(ms, 0) + 1
                elif frame["type"] == "hello":
                    await ws.send(welcome)
                    await ws.send(config)
        except ConnectionClosed:
            pass

    return handle


async def flush(counts, client):
    while True:
        await asyncio.sleep(0.1)
        recorded, counts.recorded = counts.recorded, 0
        latency, counts.latency = counts.latency, {}
        if recorded:
            async with client.pipeline(transaction=False) as pipe:
                pipe.incrby(RECORDED_KEY, recorded)
                for ms, n in latency.items():
                    pipe.hincrby(LATENCY_KEY, str(ms), n)
                await pipe.execute()


async def main(args):
    if args.decoder == "orjson":
        import orjson

        loads = orjson.loads
    else:
        loads = json.loads
    counts = Counts()
    client = redis.asyncio.Redis.from_url(args.redis_url)
    async with serve(handler(loads, counts), "127.0.0.1", args.port, max_size=2**20):
        await flush(counts, client)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--decoder", choices=["json", "orjson"], default="json")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio",
                        help="the event loop: asyncio's own, or uvloop's (as the gateway runs)")
    arguments = parser.parse_args()
    if arguments.loop == "uvloop":
        import uvloop

        uvloop.run(main(arguments))
    else:
        asyncio.run(main(arguments))
