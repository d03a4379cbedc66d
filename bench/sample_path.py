"""What a sample costs the server, without the sockets: the agent consumer's per-sample work
(gateway/consumers.py on_sample) called directly, on the simulated H200 trace.

    .venv/bin/python bench/sample_path.py [--samples 20000] [--rounds 3]

No database or Redis: the live store is the production one (RedisLiveStore), whose record()
encodes and buffers without I/O; its buffer is emptied every 500 samples, as a flush would.
It prints the CPU per sample of the whole path in a process that does not lead (an agent
gateway beside `manage.py publisher`) and of each part, what the publisher's leader pays to
fold a sample (its own, and one handed over through Redis), the best of --rounds each, and
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
    from nodes.live_store import RedisLiveStore, _decode_samples, encode_entry

    texts, totals = frames_of_the_trace()
    # record() does no I/O. A process that does not lead hands each entry over; the leader
    # folds its own samples as it records them, and the others' in read_fold().
    store, leader = RedisLiveStore("redis://unused"), RedisLiveStore("redis://unused")
    leader.set_leading(True)

    def emptied(i):
        if i % 500 == 0:
            for each in (store, leader):
                each.pending, each.pending_samples = {}, {}

    def whole_path(i):
        frame = fast_sample(texts[i % TEXTS])
        [gpu.uuid for gpu in frame.gpus if gpu.uuid not in totals]
        store.record(1, live_sample(frame, node_id=7, received_at=time.time(),
                                    memory_totals=totals))
        emptied(i)

    def leaders_own(i):
        leader.record(1, entries[i % TEXTS])
        emptied(i)

    entries = [live_sample(fast_sample(text), node_id=7, received_at=time.time(),
                           memory_totals=totals) for text in texts]
    handed_over = [b"1\n" + encode_entry(entry) for entry in entries]

    def leaders_fold_of_another(i):
        for cluster_id, sample in _decode_samples([handed_over[i % TEXTS]]):
            leader._fold(cluster_id, sample)

    parts = {
        "the whole path (a process not leading)": whole_path,
        "  fast_sample (read and check)": lambda i: fast_sample(texts[i % TEXTS]),
        "  record (encode, hand over)": lambda i: (store.record(1, entries[i % TEXTS]),
                                                   emptied(i)),
        "the leader's record (encode, fold)": leaders_own,
        "the leader's fold of a handed-over one": leaders_fold_of_another,
        "orjson.loads alone (the floor)": lambda i: orjson.loads(texts[i % TEXTS]),
    }
    print(f"bench/sample_path.py: {args.samples} samples of {len(texts[0])} bytes (8 GPUs), "
          f"best of {args.rounds}")
    for name, func in parts.items():
        print(f"{name:40s} {cpu_per_call(func, args.samples, args.rounds):6.1f} us a sample")
        emptied(0)


if __name__ == "__main__":
    main()
