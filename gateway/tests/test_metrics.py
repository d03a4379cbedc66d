import re
import time

import pytest

from healthchecks.models import HealthEvent
from gateway.protocol import live_sample
from nodes.live_store import get_live_store, reset_live_store

from nodes.tests.factories import GpuFactory, NodeFactory

pytestmark = pytest.mark.django_db
TOKEN = "s3cret-scrape-token"


@pytest.fixture
def memory_store(settings):
    settings.REDIS_URL = None
    # Samples stay fresh for 30 s however slowly a test runs; the silent node is 60 s old.
    settings.CLUSTERUI_HEARTBEAT_INTERVALS = 30
    reset_live_store()
    yield get_live_store()
    reset_live_store()


@pytest.fixture
def scraping(settings):
    settings.CLUSTERUI_METRICS_TOKEN = TOKEN


def scrape(client, token=TOKEN):
    return client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}")


def test_metrics_use_dcgm_names_and_labels(client, cluster, memory_store, scraping):
    node = NodeFactory(cluster=cluster, name="gpu-017", hostname="gpu-017.internal")
    gpu = GpuFactory(node=node, index=3, uuid="GPU-dd6ed4ff-be65-92a6-4ef1-1d9b77bae10b",
                     pci_bus_id="00000000:00:06.0")
    HealthEvent.objects.create(node=node, gpu=gpu, signature="xid:79", severity="critical",
                               first_seen=node.joined_at, last_seen=node.joined_at)
    frame = {"type": "sample", "seq": 1, "ts": time.time(), "node": {},
             "gpus": [{"uuid": gpu.uuid, "util_pct": 100, "mem_util_pct": 24,
                       "mem_used_bytes": 1703936000, "temp_c": 56, "power_w": 693.463,
                       "sm_clock_mhz": 1455, "clock_event_reasons": 4, "ecc_dbe_volatile": 0,
                       "pcie_tx_bps": 7213056, "pcie_rx_bps": None}]}
    memory_store.record(cluster.pk, live_sample(frame, node_id=node.pk, received_at=time.time(),
                                               memory_totals={gpu.uuid: 150754820096}))

    response = scrape(client)

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    text = response.text
    labels = ('{gpu="3",UUID="GPU-dd6ed4ff-be65-92a6-4ef1-1d9b77bae10b",'
              'pci_bus_id="00000000:00:06.0",device="nvidia3",modelName="NVIDIA H200",'
              'Hostname="gpu-017.internal",cluster="prod-h200"}')
    assert f"DCGM_FI_DEV_GPU_UTIL{labels} 100" in text
    assert f"DCGM_FI_DEV_GPU_TEMP{labels} 56" in text
    assert f"DCGM_FI_DEV_POWER_USAGE{labels} 693.463" in text
    assert f"DCGM_FI_DEV_FB_USED{labels} 1625" in text  # MiB, as DCGM reports it
    assert f"DCGM_FI_DEV_XID_ERRORS{labels} 79" in text
    assert "# TYPE DCGM_FI_DEV_GPU_UTIL gauge" in text
    assert "DCGM_FI_PROF_PCIE_RX_BYTES{" not in text  # unsupported: no sample, not zero
    for line in text.split("# HELP clusterui_")[0].splitlines():  # the DCGM part
        assert line.startswith("#") or re.match(r"^[A-Z_]+\{[^}]*\} [-0-9.e+]+$", line), line


def test_gpu_activity_is_exported_as_dcgms_profiling_ratios(client, cluster, memory_store,
                                                            scraping):
    """NVIDIA's stock DCGM dashboard plots DCGM's profiling fields, each 0-1; the agent
    reports NVML's GPM metrics in percent (issue 27). A GPU without GPM has no series."""
    node = NodeFactory(cluster=cluster)
    hopper, ampere = GpuFactory(node=node, index=0), GpuFactory(node=node, index=1)
    frame = {"type": "sample", "seq": 1, "ts": time.time(), "node": {}, "gpus": [
        {"uuid": hopper.uuid, "util_pct": 100, "gr_engine_active_pct": 99.5,
         "sm_active_pct": 96.8, "sm_occupancy_pct": 47.5, "tensor_active_pct": 83.2,
         "dram_active_pct": 38.4},
        {"uuid": ampere.uuid, "util_pct": 100, "gr_engine_active_pct": None,
         "sm_active_pct": None, "sm_occupancy_pct": None, "tensor_active_pct": None,
         "dram_active_pct": None}]}
    memory_store.record(cluster.pk, live_sample(frame, node_id=node.pk, received_at=time.time(),
                                               memory_totals={}))

    text = scrape(client).text

    values = {name: float(value) for name, value in re.findall(
        rf'^(DCGM_FI_PROF_\w+)\{{gpu="0",UUID="{hopper.uuid}"[^}}]*\}} (\S+)$', text, re.M)}
    assert values == {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.995, "DCGM_FI_PROF_SM_ACTIVE": 0.968,
                      "DCGM_FI_PROF_SM_OCCUPANCY": 0.475,
                      "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.832,
                      "DCGM_FI_PROF_DRAM_ACTIVE": 0.384}
    assert f'UUID="{ampere.uuid}"' in text  # its other series are there
    assert not re.search(rf'^DCGM_FI_PROF_(GR|SM|PIPE|DRAM)\w*\{{[^}}]*{ampere.uuid}', text, re.M)


def test_a_silent_node_has_no_current_values(client, cluster, memory_store, scraping):
    node = NodeFactory(cluster=cluster)
    gpu = GpuFactory(node=node)
    frame = {"type": "sample", "seq": 1, "ts": 0, "gpus": [{"uuid": gpu.uuid, "util_pct": 5}]}
    memory_store.record(cluster.pk, live_sample(frame, node_id=node.pk,
                                               received_at=time.time() - 60, memory_totals={}))
    assert "DCGM_FI_DEV_GPU_UTIL{" not in scrape(client).text


def test_metrics_need_the_bearer_token(client, scraping):
    assert scrape(client, token="wrong").status_code == 401
    assert client.get("/metrics").status_code == 401


def test_metrics_are_off_without_a_token_setting(client, settings):
    settings.CLUSTERUI_METRICS_TOKEN = None
    assert scrape(client).status_code == 404


def sample_of(gpu):
    return {"type": "sample", "seq": 1, "ts": time.time(), "node": {},
            "gpus": [{"uuid": gpu.uuid, "util_pct": 50}]}


def test_a_scrape_per_cluster_holds_that_clusters_series_only(client, cluster, memory_store,
                                                             scraping):
    from clusters.tests.factories import ClusterFactory

    other = ClusterFactory(name="other", slug="other")
    uuids = {}
    for owner in (cluster, other):
        gpu = GpuFactory(node=NodeFactory(cluster=owner))
        uuids[owner.slug] = gpu.uuid
        memory_store.record(owner.pk, live_sample(sample_of(gpu), node_id=gpu.node_id,
                                                 received_at=time.time(), memory_totals={}))

    one = client.get(f"/metrics?cluster={cluster.slug}",
                     HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content.decode()
    assert f'UUID="{uuids[cluster.slug]}"' in one and uuids["other"] not in one
    assert f'clusterui_nodes{{cluster="{cluster.slug}"' in one
    assert 'cluster="other"' not in one
    assert "clusterui_gateway_" not in one and "clusterui_publisher_" not in one

    process = client.get("/metrics?cluster=", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    text = process.content.decode()
    assert "clusterui_gateway_agents_connected" in text and "DCGM_FI_DEV_GPU_UTIL{" not in text
    assert "cluster=" not in text

    everything = scrape(client).content.decode()
    assert uuids["other"] in everything and "clusterui_gateway_" in everything


def test_prometheus_finds_a_target_per_cluster(client, cluster, scraping):
    assert client.get("/metrics/targets").status_code == 401
    response = client.get("/metrics/targets", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    assert response.json() == [
        {"targets": ["testserver"],
         "labels": {"__param_cluster": cluster.slug, "clusterui_scope": cluster.slug}},
        {"targets": ["testserver"],
         "labels": {"__param_cluster": "", "clusterui_scope": "process"}},
    ]
