"""One hostile node for bench/flood: events near the largest size PROTOCOL.md allows, sent as
fast as the socket takes them, answers read and counted but never waited for; after a close
(4429) it connects again at once and goes on. Prints what it sent and got as one JSON line.

    python bench/flood/flooder.py --url ws://127.0.0.1:PORT/ws/agent/ --token T --node N \\
        --seconds 60
"""

import argparse
import asyncio
import json
import time
import uuid
from collections import Counter

import websockets

LINE = "x" * 900


def big_event(gpu_uuid):
    return json.dumps({
        "type": "event", "id": str(uuid.uuid4()), "ts": time.time(), "signature": "xid:13",
        "gpu_uuid": gpu_uuid, "severity": "warning", "message": "m" * 1000,
        "detail": {"lines": [LINE] * 17}})  # about 15.5 KiB of detail: under the 16 KiB


async def one_connection(args, counts, deadline):
    headers = {"Authorization": f"Bearer {args.token}"}
    async with websockets.connect(args.url, additional_headers=headers, max_size=None,
                                  ping_interval=None, close_timeout=1) as ws:
        gpus = [{"index": 0, "uuid": "GPU-flood-0", "name": "NVIDIA H200"}]
        await ws.send(json.dumps({"type": "hello", "node": args.node, "boot_id": "flood",
                                  "agent_version": "flood", "gpus": gpus}))

        async def read():
            async for message in ws:
                frame = json.loads(message)
                counts[frame.get("code") or frame.get("type")] += 1

        reader = asyncio.ensure_future(read())
        try:
            while time.monotonic() < deadline:
                text = big_event("GPU-flood-0")
                await ws.send(text)
                counts["sent"] += 1
                counts["sent_bytes"] += len(text)
        finally:
            reader.cancel()


async def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    counts, closes = Counter(), Counter()
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        try:
            await one_connection(args, counts, deadline)
        except websockets.ConnectionClosed as exc:
            closes[exc.rcvd.code if exc.rcvd else None] += 1
        except OSError:
            await asyncio.sleep(0.1)
    print(json.dumps({"flooder": dict(counts), "closes": {str(k): v for k, v in closes.items()},
                      "seconds": args.seconds}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
