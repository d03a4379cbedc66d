"""common.bulk_sql on both databases: what it writes reads back through the ORM as the ORM
would have written it, rows come back in order, a partial unique index is respected, and
an update touches only the rows its condition allows. `make test` runs it against
PostgreSQL in-process and against SQLite (embedded mode) in a subprocess."""

import os
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

REPO = Path(__file__).resolve().parents[2]


def exercise():
    """The checks, on whatever database the settings name (raises AssertionError)."""
    from common.bulk_sql import insert_rows, one_of, qualified, select, table, column, \
        update_rows
    from clusters.models import Cluster
    from healthchecks.models import HealthEvent
    from nodes.models import Gpu, Node

    cluster = Cluster.objects.create(name="bulk", slug=f"bulk-{uuid.uuid4().hex[:8]}",
                                     gpu_type="H200", gpus_per_node=8)
    node = Node.objects.create(cluster=cluster, name="gpu-001", joined_at=timezone.now())
    gpu = Gpu.objects.create(node=node, index=3, uuid="GPU-3")
    now = timezone.now().replace(microsecond=123456)
    columns = ("public_id", "node", "gpu", "signature", "severity", "source", "message",
               "evidence", "first_seen", "last_seen", "count", "closed_reason", "in_maintenance")
    ids = [uuid.uuid4() for _ in range(3)]
    rows = [(ids[0], node.pk, gpu.pk, "xid:79", "critical", "passive", "fell off",
             {"xid": 79, "n": [1]}, now, now, 1, "", False),
            (ids[1], node.pk, None, "slurmd_down", "warning", "active", "", {}, now, now, 2, "",
             True),
            (ids[2], node.pk, gpu.pk, "thermal", "warning", "passive", "hot", {"c": 91.5}, now,
             now, 3, "", False)]

    inserted = insert_rows(HealthEvent, columns, rows, returning=("id", "signature"))

    # Returned in the order given; read back through the ORM, as the ORM writes them.
    assert [signature for _, signature in inserted] == ["xid:79", "slurmd_down", "thermal"]
    events = HealthEvent.objects.in_bulk([event_id for event_id, _ in inserted])
    first = events[inserted[0][0]]
    assert (first.public_id, first.gpu_id, first.evidence, first.first_seen, first.count) == (
        ids[0], gpu.pk, {"xid": 79, "n": [1]}, now, 1)
    assert events[inserted[1][0]].in_maintenance is True
    assert events[inserted[1][0]].gpu_id is None

    # A second open event of a key is left out (the partial unique indexes), the rest go in.
    again = insert_rows(HealthEvent, columns, [
        (uuid.uuid4(), *rows[0][1:]), (uuid.uuid4(), *rows[1][1:]),
        (uuid.uuid4(), node.pk, gpu.pk, "power", "warning", "passive", "", {}, now, now, 1, "",
         False)],
        returning=("signature",), conflict_do_nothing=True)
    assert again == [("power",)]

    # Each row its own values; combined with the old ones; only where the condition holds.
    xid_id, slurmd_id, thermal_id = (event_id for event_id, _ in inserted)
    HealthEvent.objects.filter(pk=slurmd_id).update(closed_at=now)
    later = now + timedelta(seconds=5)
    updated = update_rows(
        HealthEvent, ("count", "last_seen", "message"),
        [(xid_id, 4, later, ""), (slurmd_id, 9, later, "x"), (thermal_id, 1, now - timedelta(1),
                                                              "hotter")],
        combine={"count": "{old} + {new}",
                 "last_seen": "CASE WHEN {old} > {new} THEN {old} ELSE {new} END",
                 "message": "CASE WHEN {new} = '' THEN {old} ELSE {new} END"},
        where=f"{qualified(HealthEvent, 'closed_at')} IS NULL", returning=True)
    assert sorted(updated) == sorted([xid_id, thermal_id])
    values = {event.pk: (event.count, event.last_seen, event.message)
              for event in HealthEvent.objects.filter(pk__in=[xid_id, slurmd_id, thermal_id])}
    assert values == {xid_id: (5, later, "fell off"), slurmd_id: (2, now, ""),
                      thermal_id: (4, now, "hotter")}

    # one_of: one parameter for many values, integers or UUIDs.
    where, params = one_of(HealthEvent, "public_id", [ids[0], ids[2], uuid.uuid4()])
    found = select(f"SELECT {column(HealthEvent, 'signature')} FROM {table(HealthEvent)} "
                   f"WHERE {where}", params)
    assert sorted(found) == [("thermal",), ("xid:79",)]
    where, params = one_of(Node, "id", [node.pk, node.pk + 1000])
    assert select(f"SELECT {column(Node, 'name')} FROM {table(Node)} WHERE {where}",
                  params) == [("gpu-001",)]

    # A JSON column of nested objects, and a datetime: the minute's node rollups, where a
    # node removed within the minute is left out and a minute already written is kept.
    from nodes.models import NodeRollup
    from nodes.rollups import write_node_rollups

    minute = now.replace(second=0, microsecond=0)
    # util_pct, sm_active_pct (none: no GPM), mem_used_bytes, temp_c, power_w (none)
    gpu_stats = [180.0, 2, 100.0, 0.0, 0, None, 2e11, 2, 1.1e11, 90, 2, 50, 0.0, 0, None]
    node_stats = [1e9, 1, 1e9, 2e9, 1, 2e9, 50.5, 1, 50.5]
    gone = node.pk + 1000
    write_node_rollups(minute, {node.pk: {"GPU-3": gpu_stats}, gone: {"GPU-x": gpu_stats}},
                       {node.pk: node_stats, gone: node_stats})
    write_node_rollups(minute, {node.pk: {"GPU-3": [0.0, 0, None] * 5}},
                       {node.pk: [0.0, 0, None] * 3})
    [rollup] = NodeRollup.objects.filter(node__cluster=cluster)
    assert rollup.minute == minute
    assert rollup.gpus == {"GPU-3": {"util_pct": [90.0, 100.0], "sm_active_pct": [None, None],
                                     "mem_used_bytes": [1e11, 1.1e11],
                                     "temp_c": [45.0, 50], "power_w": [None, None]}}
    assert rollup.node_metrics == {"net_rx_bps": [1e9, 1e9], "net_tx_bps": [2e9, 2e9],
                                   "cpu_pct": [50.5, 50.5]}


@pytest.mark.django_db
def test_bulk_sql_on_the_suites_database():
    exercise()


@pytest.mark.integration
def test_bulk_sql_on_sqlite(tmp_path):
    env = {**os.environ, "CLUSTERUI_MODE": "embedded", "CLUSTERUI_DATA_DIR": str(tmp_path),
           "DJANGO_SETTINGS_MODULE": "clusterui.settings"}
    for name in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL"):
        env.pop(name, None)
    script = ("import django; django.setup(); "
              "from django.core.management import call_command; "
              "call_command('migrate', verbosity=0); "
              "from django.db import connection; assert connection.vendor == 'sqlite'; "
              "from common.tests.test_bulk_sql import exercise; exercise(); print('checked')")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("checked")
