"""/metrics in Prometheus' text format, with dcgm-exporter's metric names and labels, so
NVIDIA's stock DCGM Grafana dashboard works on clusterui's data unchanged."""

from clusterui.models import Cluster
from healthchecks.catalog import xid_code
from healthchecks.models import HealthEvent

from .live import get_live_store
from .models import Gpu
from .publisher import stale_after_s

MIB = 1024 * 1024

# (name, help, type, value from a live GPU entry). Help texts are dcgm-exporter's.
GPU_SERIES = [
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "gauge", lambda g: g.get("util_pct")),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", "gauge",
     lambda g: g.get("mem_util_pct")),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "gauge",
     lambda g: None if g.get("mem_used_bytes") is None else g["mem_used_bytes"] / MIB),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "gauge",
     lambda g: None if g.get("mem_used_bytes") is None or not g.get("mem_total_bytes")
     else (g["mem_total_bytes"] - g["mem_used_bytes"]) / MIB),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "gauge", lambda g: g.get("temp_c")),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "gauge", lambda g: g.get("power_w")),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "gauge",
     lambda g: g.get("sm_clock_mhz")),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "Current clock event reasons (bitmask).", "gauge",
     lambda g: g.get("clock_event_reasons")),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.",
     "counter", lambda g: g.get("ecc_dbe_volatile")),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "The rate of data transmitted over the PCIe bus, in bytes "
     "per second.", "gauge", lambda g: g.get("pcie_tx_bps")),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "The rate of data received over the PCIe bus, in bytes "
     "per second.", "gauge", lambda g: g.get("pcie_rx_bps")),
]
XID_SERIES = ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", "gauge")


def escape(value):
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def labels(gpu, cluster_slug):
    pairs = [("gpu", gpu.index), ("UUID", gpu.uuid), ("pci_bus_id", gpu.pci_bus_id),
             ("device", f"nvidia{gpu.index}"), ("modelName", gpu.name),
             ("Hostname", gpu.node.hostname or gpu.node.name), ("cluster", cluster_slug)]
    return ",".join(f'{key}="{escape(value)}"' for key, value in pairs)


def open_xids():
    """{gpu_id: code} of each GPU's most recent open Xid event."""
    xids = {}
    rows = (HealthEvent.objects.open().filter(signature__startswith="xid:", gpu__isnull=False)
            .order_by("last_seen").values_list("gpu_id", "signature"))
    for gpu_id, signature in rows:
        code = xid_code(signature)
        if code is not None:
            xids[gpu_id] = code
    return xids


def render_metrics(now_ts):
    store = get_live_store()
    gpus = Gpu.objects.select_related("node").only(
        "index", "uuid", "pci_bus_id", "name", "node__name", "node__hostname", "node__cluster_id")
    by_node = {}
    for gpu in gpus:
        by_node.setdefault(gpu.node_id, {})[gpu.uuid] = gpu
    xids = open_xids()
    lines = {name: [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
             for name, help_, kind, _ in GPU_SERIES}
    xid_lines = [f"# HELP {XID_SERIES[0]} {XID_SERIES[1]}", f"# TYPE {XID_SERIES[0]} gauge"]
    for cluster in Cluster.objects.only("slug"):
        for entry in store.read(cluster.pk).values():
            if now_ts - entry["received_at"] > stale_after_s():
                continue  # a silent node has no current value; Prometheus marks it stale
            known = by_node.get(entry["node_id"], {})
            for live_gpu in entry["gpus"]:
                gpu = known.get(live_gpu["uuid"])
                if gpu is None:
                    continue
                label_text = labels(gpu, cluster.slug)
                for name, _, _, value_of in GPU_SERIES:
                    value = value_of(live_gpu)
                    if value is not None:
                        lines[name].append(f"{name}{{{label_text}}} {value:g}")
                xid_lines.append(f"{XID_SERIES[0]}{{{label_text}}} {xids.get(gpu.pk, 0)}")
    return "\n".join([*(line for series in lines.values() for line in series), *xid_lines]) + "\n"
