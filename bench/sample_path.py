"""What a sample costs the server, without the sockets: the agent consumer's per-sample work
(gateway/consumers.py on_sample) called directly, on the simulated H200 trace.

    .venv/bin/python bench/sample_path.py [--samples 20000] [--rounds 3]

No database or Redis: the live store is the production one (RedisLiveStore), whose record()
encodes and buffers without I/O; its buffer is emptied every 500 samples, as a flush would.
It prints the CPU per sample of the whole path and of each part (the best of --rounds), and
orjson.loads of the same text: the floor a server that only decodes its frames pays (the
bare server of bench/ingest).
"""

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "clusterui.settings")

TEXTS = 200  # distinct frames, from the trace's successive readings


def frames_of_the_trace():
    from agent.connection import protocol
    from agent.node_metrics import NodeMetrics
    from agent.sim.backend import SimulatedBackend

    backend = SimulatedBackend("gpu-001")
    node_metrics = NodeMetrics()
    node_metrics.read()
    time.sleep(0.2)
    node = node_metrics.read()
    texts = [protocol.encode(protocol.sample_frame(seq=i, ts=time.time(),
                                                   gpus=backend.read_gpus(), node=node))
             for i in range(TEXTS)]
    totals = {gpu["uuid"]: gpu.get("memory_total_bytes") for gpu in backend.gpus()}
    return texts, totals


def cpu_per_call(func, calls, rounds):
    """The best of `rounds` of `calls` calls of func(i), in microseconds of CPU a call."""
    best = None
    for _ in range(rounds):
        started = time.process_time()
        for i in range(calls):
            func(i)
        spent = (time.process_time() - started) / calls * 1e6
        best = spent if best is None else min(best, spent)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import django

    django.setup()
    import orjson

    from gateway.protocol import fast_sample, live_sample
    from nodes.live_store import RedisLiveStore

    texts, totals = frames_of_the_trace()
    store = RedisLiveStore("redis://unused")  # record() does no I/O

    def whole_path(i):
        frame = fast_sample(texts[i % TEXTS])
        [gpu.uuid for gpu in frame.gpus if gpu.uuid not in totals]
        store.record(1, live_sample(frame, node_id=7, received_at=time.time(),
                                    memory_totals=totals))
        if i % 500 == 0:
            store.pending, store.pending_readings = {}, []

    entries = [live_sample(fast_sample(text), node_id=7, received_at=time.time(),
                           memory_totals=totals) for text in texts]
    parts = {
        "the whole path": whole_path,
        "  fast_sample (read and check)": lambda i: fast_sample(texts[i % TEXTS]),
        "  record (encode, reading, minute)": lambda i: store.record(1, entries[i % TEXTS]),
        "orjson.loads alone (the floor)": lambda i: orjson.loads(texts[i % TEXTS]),
    }
    print(f"bench/sample_path.py: {args.samples} samples of {len(texts[0])} bytes (8 GPUs), "
          f"best of {args.rounds}")
    for name, func in parts.items():
        print(f"{name:38s} {cpu_per_call(func, args.samples, args.rounds):6.1f} us a sample")
        store.pending, store.pending_readings = {}, []


if __name__ == "__main__":
    main()
