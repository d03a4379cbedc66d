"""The node page's charts (rollups and the live endpoint) and its SSH command."""

import time
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse
from django.utils import timezone

from clusters.models import AuditEntry, Cluster, validate_ssh_command_template
from clusters.tests.factories import UserFactory
from clusters.roles import Role
from gateway.protocol import live_sample
from nodes.live_store import get_live_store, reset_live_store
from nodes.models import NodeRollup

from .factories import GpuFactory, NodeFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def store(settings):
    settings.REDIS_URL = ""
    # Samples stay fresh for 10 minutes however slowly a test runs; the stale cases use -1 h.
    settings.CLUSTERUI_HEARTBEAT_INTERVALS = 600
    reset_live_store()
    yield get_live_store()
    reset_live_store()


@pytest.fixture
def node(cluster):
    node = NodeFactory(cluster=cluster, name="gpu-017", hostname="gpu-017.rack3.internal")
    GpuFactory(node=node, index=0, uuid="GPU-a")
    GpuFactory(node=node, index=1, uuid="GPU-b")
    return node


def rollup(node, minute, util_a, util_b=None):
    gpus = {"GPU-a": {"util_pct": [util_a, 100], "sm_active_pct": [util_a * 0.9, 95.0],
                      "mem_used_bytes": [2**30, 2**31], "temp_c": [60.04, 70],
                      "power_w": [500, 600]}}
    if util_b is not None:
        gpus["GPU-b"] = {"util_pct": [util_b, util_b], "mem_used_bytes": [None, None],
                         "temp_c": [50, 50], "power_w": [400, 400]}
    return NodeRollup.objects.create(node=node, minute=minute, gpus=gpus)


def test_the_charts_have_one_line_per_gpu_and_metric_for_the_last_hour(client_for, viewer,
                                                                        node):
    now = timezone.now().replace(second=0, microsecond=0)
    rollup(node, now - timedelta(hours=2), 5)  # older than the hour
    rollup(node, now - timedelta(minutes=2), 40, 80)
    rollup(node, now - timedelta(minutes=1), 50)  # GPU-b missed this minute
    url = reverse("nodes:charts", args=[node.cluster.slug, node.name])

    hour = client_for(viewer).get(url).json()
    day = client_for(viewer).get(url + "?range=day").json()

    assert hour["gpus"] == [{"index": 0, "uuid": "GPU-a", "memory_total_bytes": 150754820096},
                            {"index": 1, "uuid": "GPU-b", "memory_total_bytes": 150754820096}]
    assert len(hour["minute"]) == 2 and len(day["minute"]) == 3
    assert hour["series"]["GPU-a"] == {"util_pct": [40, 50], "sm_active_pct": [36.0, 45.0],
                                       "mem_used_bytes": [2**30, 2**30],
                                       "temp_c": [60.0, 60.0], "power_w": [500, 500]}
    assert hour["series"]["GPU-b"]["util_pct"] == [80, None]
    assert hour["series"]["GPU-b"]["sm_active_pct"] == [None, None]  # no GPM (before Hopper)
    assert hour["series"]["GPU-b"]["mem_used_bytes"] == [None, None]


def test_the_charts_of_a_node_without_rollups_are_empty(client_for, viewer, node):
    data = client_for(viewer).get(reverse("nodes:charts", args=[node.cluster.slug, node.name]))
    assert data.json()["minute"] == [] and data.json()["series"]["GPU-a"]["util_pct"] == []


def test_the_live_endpoint_gives_the_latest_fresh_sample_per_gpu(client_for, viewer, node,
                                                                 store):
    url = reverse("nodes:live", args=[node.cluster.slug, node.name])
    client = client_for(viewer)
    assert client.get(url).json() == {"at": None, "gpus": {}}

    now = time.time()
    frame = {"type": "sample", "seq": 3, "ts": now - 0.2, "node": {},
             "gpus": [{"uuid": "GPU-a", "util_pct": 97, "mem_used_bytes": 5, "temp_c": 71,
                       "power_w": 650.5, "sm_clock_mhz": 1980, "sm_active_pct": 88.5}]}
    store.record(node.cluster_id, live_sample(frame, node_id=node.pk, received_at=now,
                                             memory_totals={}))
    assert client.get(url).json() == {"at": now - 0.2, "gpus": {"GPU-a": {
        "util_pct": 97, "sm_active_pct": 88.5, "mem_used_bytes": 5, "temp_c": 71,
        "power_w": 650.5}}}

    store.record(node.cluster_id, live_sample(frame, node_id=node.pk, received_at=now - 3600,
                                             memory_totals={}))
    assert client.get(url).json()["at"] is None  # stale


def test_in_production_the_live_endpoint_reads_its_one_node_from_redis(client_for, viewer, node,
                                                                       redis_live_store):
    import asyncio

    other = NodeFactory(cluster=node.cluster, name="gpu-018")
    writer = redis_live_store()
    now = time.time()
    for each, util in [(node, 97), (other, 3)]:
        frame = {"type": "sample", "seq": 1, "ts": now, "node": {},
                 "gpus": [{"uuid": f"GPU-{each.name}", "util_pct": util}]}
        writer.record(node.cluster_id, live_sample(frame, node_id=each.pk, received_at=now,
                                                  memory_totals={}))
    asyncio.run(writer.flush())
    reset_live_store()  # the view reads on a connection of its own, as another process

    reader = redis_live_store()
    assert reader.read_node(node.cluster_id, node.pk) == reader.read(node.cluster_id)[node.pk]
    assert reader.read_node(node.cluster_id, 10**9) is None
    live = client_for(viewer).get(reverse("nodes:live", args=[node.cluster.slug, node.name]))
    assert live.json() == {"at": now, "gpus": {"GPU-gpu-017": {
        "util_pct": 97, "sm_active_pct": None, "mem_used_bytes": None, "temp_c": None,
        "power_w": None}}}


def test_the_node_page_has_the_charts_panel(client_for, viewer, node):
    text = client_for(viewer).get(node.get_absolute_url() + "?range=day").text
    assert 'data-charts-url="/c/prod-h200/nodes/gpu-017/charts/"' in text
    assert 'data-live-url="/c/prod-h200/nodes/gpu-017/live/"' in text
    assert '<a href="?range=day" data-range="day" aria-current="page">' in text
    assert "js/node_charts" in text and "vendor/plotly" in text


def test_the_ssh_command_fills_the_clusters_template(client_for, cluster, node):
    Cluster.objects.filter(pk=cluster.pk).update(
        ssh_login_host="login.prod", ssh_command_template="ssh -J {login} {user}@{hostname} # {node}")
    text = client_for(UserFactory(username="bob", role=Role.VIEWER)).get(
        node.get_absolute_url()).text
    assert ('<code id="ssh-command">ssh -J login.prod bob@gpu-017.rack3.internal # gpu-017'
            '</code> <button type="button" data-copy="ssh-command">Copy</button>') in text


def test_the_default_ssh_command_and_none_when_the_template_is_empty(client_for, viewer, cluster,
                                                                      node):
    client = client_for(viewer)
    assert '<code id="ssh-command">ssh vera@gpu-017</code>' in client.get(
        node.get_absolute_url()).text
    Cluster.objects.filter(pk=cluster.pk).update(ssh_command_template="")
    assert 'id="ssh-command"' not in client.get(node.get_absolute_url()).text


def test_the_ssh_command_is_escaped(client_for, cluster, node):
    Cluster.objects.filter(pk=cluster.pk).update(ssh_login_host="<b>login</b>",
                                                 ssh_command_template="ssh -J {login} {user}@{node}")
    user = UserFactory(username="o'neil<x>", role=Role.VIEWER)
    text = client_for(user).get(node.get_absolute_url()).text
    assert "ssh -J &lt;b&gt;login&lt;/b&gt; o&#x27;neil&lt;x&gt;@gpu-017" in text
    assert "<b>login</b>" not in text


@pytest.mark.parametrize("template, valid", [
    ("ssh {user}@{node}", True),
    ("ssh -J {login} {user}@{hostname}", True),
    ("ssh {user.__class__}@{node}", False),
    ("ssh {0}@{node}", False),
    ("ssh {users}@{node}", False),
])
def test_the_template_allows_only_its_placeholders(template, valid):
    if valid:
        validate_ssh_command_template(template)
    else:
        with pytest.raises(ValidationError, match="Unknown placeholder"):
            validate_ssh_command_template(template)


def test_an_admin_sets_the_ssh_template_in_the_cluster_settings(client_for, admin, cluster):
    url = reverse("clusterui:cluster_settings", args=[cluster.slug])
    data = {f: getattr(cluster, f) for f in Cluster.CONFIGURATION_FIELDS}
    data.pop("acceptance_tests_enabled")
    client = client_for(admin)

    refused = client.post(url, {**data, "ssh_command_template": "ssh {nodes}"})
    assert refused.status_code == 200 and "Unknown placeholder {nodes}" in refused.text

    client.post(url, {**data, "ssh_login_host": "login.prod",
                      "ssh_command_template": "ssh -J {login} {user}@{node}"})
    cluster.refresh_from_db()
    assert cluster.ssh_command_template == "ssh -J {login} {user}@{node}"
    assert AuditEntry.objects.get(action="cluster.update").changes["ssh_login_host"] == {
        "before": "", "after": "login.prod"}
