"""The bench's fleet: one cluster, N nodes and a node token each, through nodes.services.

    python bench/ingest/fleet.py --nodes 2000 --out fleet.json

Writes [{"node", "node_id", "token"}, ...] and the cluster id to --out. Runs in the
environment's mode (bench/ingest/run.sh: production, against the throwaway PostgreSQL).
Not measured: one transaction for all the nodes, one for all the tokens.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "clusterui.settings")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import django

    django.setup()
    from django.db import transaction

    from clusters.models import Cluster
    from nodes.services import do_issue_node_token, do_register_node

    started = time.monotonic()
    cluster, _ = Cluster.objects.get_or_create(
        slug="bench", defaults={"name": "bench", "gpu_type": "H200", "gpus_per_node": 8})
    names = [f"bench-{i:05d}" for i in range(args.nodes)]
    with transaction.atomic():
        nodes = [do_register_node(cluster, name) for name in names]
    with transaction.atomic():
        fleet = [{"node": node.name, "node_id": node.pk, "token": do_issue_node_token(node)[1]}
                 for node in nodes]
    Path(args.out).write_text(json.dumps({"cluster_id": cluster.pk, "nodes": fleet}))
    print(f"fleet: {len(fleet)} nodes with node tokens in cluster {cluster.slug} "
          f"({time.monotonic() - started:.1f} s)")


if __name__ == "__main__":
    main()
