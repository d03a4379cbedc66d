"""/metrics' own series (clusterui_*, written by prometheus-client), checked by Prometheus'
own promtool, and the alert rules shipped for them."""

import shutil
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from healthchecks.services import do_record_health_event
from nodes.choices import NodeState
from gateway.protocol import live_sample
from nodes.live_store import get_live_store, reset_live_store
from gateway.metrics import render_metrics
from notifications.models import Alert
from repairs.tests.factories import RepairFactory

from nodes.tests.factories import NodeFactory

pytestmark = pytest.mark.django_db
RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "clusterui.rules.yml"


def promtool():
    path = shutil.which("promtool")
    assert path, "promtool is missing: scripts/test.sh installs Debian's prometheus package"
    return path


@pytest.fixture
def memory_store(settings):
    settings.REDIS_URL = None
    reset_live_store()
    yield get_live_store()
    reset_live_store()


def series(text):
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


def test_the_console_series_count_what_the_console_holds(cluster, memory_store):
    cluster.degraded_threshold_pct = 10
    cluster.save()
    healthy = NodeFactory(cluster=cluster, name="gpu-001")
    sick = NodeFactory(cluster=cluster, name="gpu-002", state=NodeState.UNHEALTHY)
    NodeFactory(cluster=cluster, name="gpu-003", state=NodeState.PAUSED)
    do_record_health_event(sick, signature="xid:79", severity="critical")
    now = timezone.now()
    RepairFactory(node=sick)
    RepairFactory(node=healthy, status="succeeded", started_at=now - timedelta(minutes=10),
                  finished_at=now)
    Alert.objects.create(cluster=cluster, kind="repair_stuck", key="repair:9", summary="x",
                         path="/", opened_at=now)
    now_ts = time.time()  # one clock for the sample and the rendering: 2 s old, not stale
    frame = {"type": "sample", "seq": 1, "ts": now_ts, "node": {}, "gpus": []}
    hygiene = {"slurmd": {"state": "stopped", "restarts": 3},
               "processes": {"zombies": 12, "tasks": 8192, "pid_max": 32768},
               "gres": {"match": False, "nvml_gpus": 8, "slurm_gpus": 7}}
    memory_store.record(cluster.pk, live_sample(frame, node_id=healthy.pk,
                                               received_at=now_ts - 2, memory_totals={},
                                               hygiene=hygiene))

    values = series(render_metrics(now_ts, cluster.slug))

    slug = cluster.slug
    assert values[f'clusterui_nodes{{cluster="{slug}",state="unhealthy"}}'] == 1
    assert values[f'clusterui_nodes{{cluster="{slug}",state="paused"}}'] == 1
    assert values[f'clusterui_cluster_degraded{{cluster="{slug}"}}'] == 1  # 2 of 3
    assert values[f'clusterui_open_health_events{{cluster="{slug}",severity="critical",'
                  f'signature="xid:79"}}'] == 1
    assert values[f'clusterui_repairs{{cluster="{slug}",status="proposed"}}'] == 1
    bucket = 'clusterui_repair_duration_seconds_bucket{{action="reboot",cluster="{}",le="{}",' \
             'status="succeeded"}}'
    assert values[bucket.format(slug, 900)] == 1 and values[bucket.format(slug, 300)] == 0
    assert values['clusterui_repair_duration_seconds_sum{action="reboot",'
                  f'cluster="{slug}",status="succeeded"}}'] == 600
    assert values[f'clusterui_connected_agents{{cluster="{slug}"}}'] == 1
    assert 1.5 < values[f'clusterui_ingest_lag_seconds{{cluster="{slug}"}}'] < 60
    assert values[f'clusterui_alerts_firing{{cluster="{slug}",kind="repair_stuck"}}'] == 1
    node = f'{{cluster="{slug}",node="gpu-001"}}'
    assert values[f"clusterui_node_slurmd_up{node}"] == 0
    assert values[f"clusterui_node_slurmd_restarts{node}"] == 3
    assert values[f"clusterui_node_zombie_processes{node}"] == 12
    assert values[f"clusterui_node_pid_usage_ratio{node}"] == 0.25
    assert values[f"clusterui_node_gres_match{node}"] == 0
    assert not any("gpu-002" in key for key in values if "clusterui_node_" in key)


def test_promtool_finds_the_exposition_well_formed(cluster, memory_store):
    RepairFactory(node=NodeFactory(cluster=cluster), status="failed",
                  started_at=timezone.now() - timedelta(hours=1), finished_at=timezone.now())
    checked = subprocess.run([promtool(), "check", "metrics"], input=render_metrics(time.time()),
                             capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_alert_rules_pass_promtool():
    checked = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True,
                             text=True, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 12 rules found" in checked.stdout


def test_the_example_prometheus_config_passes_promtool(tmp_path):
    """deploy/prometheus/prometheus.yml: per-cluster targets through http_sd."""
    token = tmp_path / "clusterui-token"
    token.write_text("s3cret\n")
    config = (RULES.parent / "prometheus.yml").read_text()
    (tmp_path / "prometheus.yml").write_text(
        config.replace("/etc/prometheus/clusterui-token", str(token)))
    (tmp_path / RULES.name).write_text(RULES.read_text())
    checked = subprocess.run([promtool(), "check", "config", str(tmp_path / "prometheus.yml")],
                             capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr
