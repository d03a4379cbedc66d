"""What storing agent events costs the server, without the sockets: the event writer's
batch (gateway.ingest.ingest_events) called directly, in the storm bench's mix.

    bench/event_path.sh [--nodes 2000] [--batches 200,50,10,1] [--events 6000] [--profile]

Production mode against a throwaway PostgreSQL (bench/production.sh), or embedded
(`--embedded`: SQLite in the run's folder). The fleet says hello once (its GPUs); then, per
batch size, --events events round-robin over the nodes (the storm bench's mix: new
signatures, repeats of an open one, clears) go through ingest_events a batch at a time. It
prints, per batch size, the CPU per event, the statements per batch and the events/s one
core would take; --profile adds cProfile's top functions for the largest batch.
"""

import argparse
import cProfile
import io
import os
import pstats
import random
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "clusterui.settings")

from bench.storm.run import next_storm_key  # noqa: E402 - the storm bench's mix


class NodeEvents:
    """One node's open signals, and the next event of the storm's mix."""

    def __init__(self, node_id, gpu_uuids):
        self.node_id = node_id
        self.gpu_uuids = gpu_uuids
        self.open = []

    def next_frame(self, rng, new_share, clear_share):
        (index, signature), state = next_storm_key(self.open, len(self.gpu_uuids), rng,
                                                   new_share, clear_share)
        return {"type": "event", "id": str(uuid.uuid4()), "ts": time.time(),
                "signature": signature, "gpu_uuid": self.gpu_uuids[index],
                "severity": "warning", "message": f"bench/event_path: {signature}",
                "detail": {"source": "bench"}, "state": state}


def fleet(nodes):
    from django.db import transaction

    from agent.sim.backend import SimulatedBackend
    from clusters.models import Cluster
    from nodes.models import Gpu
    from nodes.services import do_record_hello, do_register_node

    cluster, _ = Cluster.objects.get_or_create(
        slug="bench-events", defaults={"name": "bench-events", "gpu_type": "H200",
                                       "gpus_per_node": 8})
    with transaction.atomic():
        for n in range(nodes):
            name = f"bench-ev-{n:05d}"
            node = do_register_node(cluster, name)
            backend = SimulatedBackend(name)
            do_record_hello(node, boot_id=str(uuid.uuid4()), agent_version="bench",
                            gpus=backend.gpus(), slurm=None)
    by_node = {}
    for node_id, gpu_uuid in Gpu.objects.filter(node__cluster=cluster).order_by(
            "node_id", "index").values_list("node_id", "uuid"):
        by_node.setdefault(node_id, []).append(gpu_uuid)
    return [NodeEvents(node_id, uuids) for node_id, uuids in by_node.items()]


def measure(nodes, batch, events, rng, args, profile=None):
    from django.db import connection, reset_queries

    from gateway.ingest import EventOutcome, ingest_events

    frames = []
    for n in range(events):
        node = nodes[n % len(nodes)]
        frames.append((node.node_id, node.next_frame(rng, args.new, args.clear)))
    batches = [frames[i:i + batch] for i in range(0, len(frames), batch)]
    connection.force_debug_cursor = True
    reset_queries()
    statements = 0
    stored = 0
    started_cpu, started = time.process_time(), time.perf_counter()
    if profile:
        profile.enable()
    for items in batches:
        outcomes = ingest_events(items)
        stored += sum(outcome is EventOutcome.STORED for outcome in outcomes)
        statements += len(connection.queries)
        reset_queries()
    if profile:
        profile.disable()
    cpu, wall = time.process_time() - started_cpu, time.perf_counter() - started
    connection.force_debug_cursor = False
    return {"batch": batch, "events": events, "stored": stored,
            "us_per_event_cpu": cpu / events * 1e6, "us_per_event_wall": wall / events * 1e6,
            "statements_per_batch": statements / len(batches),
            "one_core_events_s": events / cpu if cpu else 0}


def show_sql(nodes, batch, rng, args):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from gateway.ingest import ingest_events

    items = [(node.node_id, node.next_frame(rng, args.new, args.clear))
             for node in (nodes[n % len(nodes)] for n in range(batch))]
    with CaptureQueriesContext(connection) as captured:
        ingest_events(items)
    print(f"one batch of {batch}: {len(captured)} statements")
    for query in captured.captured_queries:
        print(f"  {query['time']:>6} s  {query['sql'][:150]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--batches", default="200,50,10,1",
                        type=lambda s: [int(n) for n in s.split(",")])
    parser.add_argument("--events", type=int, default=6000, help="per batch size")
    parser.add_argument("--new", type=float, default=0.2)
    parser.add_argument("--clear", type=float, default=0.15)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--sort", default="cumulative", help="cProfile's order: tottime, ...")
    parser.add_argument("--limit", default="45", help="cProfile's rows: a number, or a regex")
    parser.add_argument("--show-sql", action="store_true",
                        help="print the statements of one batch of the largest size")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    started = time.monotonic()
    nodes = fleet(args.nodes)
    print(f"fleet: {len(nodes)} nodes of 8 GPUs said hello in {time.monotonic() - started:.1f} s;"
          f" database: {settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]}")
    rng = random.Random(args.seed)
    measure(nodes, max(args.batches), min(args.events, 2000), rng, args)  # warm-up
    if args.show_sql:
        show_sql(nodes, max(args.batches), rng, args)
    print("| batch | events | stored | CPU per event | wall per event | statements per batch "
          "| events/s on one core |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    profile = cProfile.Profile() if args.profile else None
    for batch in args.batches:
        row = measure(nodes, batch, args.events, rng, args,
                      profile if batch == max(args.batches) else None)
        print(f"| {row['batch']} | {row['events']} | {row['stored']} "
              f"| {row['us_per_event_cpu']:.0f} us | {row['us_per_event_wall']:.0f} us "
              f"| {row['statements_per_batch']:.1f} | {row['one_core_events_s']:,.0f} |",
              flush=True)
    if profile:
        out = io.StringIO()
        limit = int(args.limit) if args.limit.isdigit() else args.limit
        pstats.Stats(profile, stream=out).sort_stats(args.sort).print_stats(limit)
        print(out.getvalue())


if __name__ == "__main__":
    main()
