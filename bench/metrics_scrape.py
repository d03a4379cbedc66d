"""The cost of a /metrics scrape at fleet size.

    .venv/bin/python bench/metrics_scrape.py [--nodes 2000] [--small 70] [--rounds 5]

Embedded mode in a throwaway data directory (SQLite, the in-memory live store): migrates,
makes one cluster of --nodes nodes and one of --small, 8 GPUs a node, and a live sample for
every node (the simulated agent's H200 readings, as the gateway stores them); then renders
the scrape (gateway.metrics.render_metrics, what /metrics answers) --rounds times each way:
the whole fleet, the big cluster alone (`?cluster=big`), the small one alone, and the
series of no cluster (`?cluster=`). Prints the CPU time (this process's, user + system) and
size of one scrape, and its share of a core when Prometheus scrapes it every 15 s.

Target (issue 25): a 2,000-node cluster's scrape costs under 5 % of a core at 15 s, that is
under 750 ms of CPU.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SCRAPE_INTERVAL_S = 15


def setup(data_dir):
    # Every sample stays current however long the run takes: the scrape renders them all.
    os.environ.update(CLUSTERUI_MODE="embedded", CLUSTERUI_DATA_DIR=str(data_dir),
                      DJANGO_SETTINGS_MODULE="clusterui.settings",
                      CLUSTERUI_HEARTBEAT_INTERVALS="1000000")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def make_cluster(slug, nodes):
    """A cluster of `nodes` nodes with 8 GPUs and a live sample each."""
    from django.utils import timezone

    from agent.connection import protocol
    from agent.sim.backend import SimulatedBackend
    from clusters.models import Cluster
    from gateway.protocol import live_sample, parse_frame
    from nodes.live_store import get_live_store
    from nodes.models import Gpu, Node

    cluster = Cluster.objects.create(name=slug, slug=slug)
    now = timezone.now()
    rows = Node.objects.bulk_create(
        Node(cluster=cluster, name=f"{slug}-{n:05d}", hostname=f"{slug}-{n:05d}", state="healthy",
             joined_at=now, last_hello_at=now) for n in range(nodes))
    store = get_live_store()
    gpus = []
    for node in rows:
        backend = SimulatedBackend(node.name)
        readings = backend.read_gpus()
        for gpu in backend.gpus():
            gpus.append(Gpu(node=node, index=gpu["index"], uuid=gpu["uuid"], name=gpu["name"],
                            pci_bus_id=gpu["pci_bus_id"],
                            memory_total_bytes=gpu["memory_total_bytes"]))
        frame = parse_frame(protocol.encode(protocol.sample_frame(
            seq=1, ts=time.time(), gpus=readings, node=None)))
        store.record(cluster.pk, live_sample(
            frame, node_id=node.pk, received_at=time.time(),
            memory_totals={gpu["uuid"]: gpu["memory_total_bytes"] for gpu in backend.gpus()}))
    Gpu.objects.bulk_create(gpus, batch_size=2000)
    return cluster


def measure(label, cluster_slug, rounds):
    from gateway.metrics import ALL_CLUSTERS, render_metrics

    seconds, size = [], 0
    for _ in range(rounds):
        started = time.process_time()
        size = len(render_metrics(time.time(), cluster_slug).encode())
        seconds.append(time.process_time() - started)
    median = statistics.median(seconds)
    share = median / SCRAPE_INTERVAL_S * 100
    scope = "all" if cluster_slug is ALL_CLUSTERS else repr(cluster_slug)
    print(f"| {label} | `{scope}` | {median * 1000:.0f} ms | {max(seconds) * 1000:.0f} ms | "
          f"{size / 1e6:.2f} MB | {share:.1f} % |")
    return median


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--small", type=int, default=70)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="clusterui-metrics-bench-") as data_dir:
        setup(Path(data_dir))
        from gateway.metrics import ALL_CLUSTERS, NO_CLUSTER

        started = time.monotonic()
        make_cluster("big", args.nodes)
        make_cluster("small", args.small)
        print(f"{args.nodes} + {args.small} nodes, 8 GPUs each, made in "
              f"{time.monotonic() - started:.0f} s; {args.rounds} scrapes each way "
              f"(median, max CPU)\n")
        print("| scrape | ?cluster= | CPU | max | size | share of a core at 15 s |")
        print("| --- | --- | --- | --- | --- | --- |")
        measure("the whole fleet", ALL_CLUSTERS, args.rounds)
        big = measure(f"the {args.nodes}-node cluster", "big", args.rounds)
        measure(f"the {args.small}-node cluster", "small", args.rounds)
        measure("no cluster", NO_CLUSTER, args.rounds)
        print(f"\n{args.nodes}-node cluster: {big / SCRAPE_INTERVAL_S * 100:.1f} % of a core "
              f"at {SCRAPE_INTERVAL_S} s (target under 5 %)")


if __name__ == "__main__":
    main()
