"""/metrics in Prometheus' text format: first the GPU series with dcgm-exporter's metric
names and labels, so NVIDIA's stock DCGM Grafana dashboard works on clusterui's data
unchanged (written as dcgm-exporter writes them: prometheus-client would add `_total` to
its counters); then the console's own series (clusterui_*), written by prometheus-client,
for alerting (deploy/prometheus/clusterui.rules.yml).

A scrape covers every cluster, or one (`?cluster=<slug>`: its GPU and console series), or
the series of no cluster (`?cluster=` empty: the publisher's tick and this process's agent
socket). A fleet of thousands of nodes is scraped per cluster, each its own target, which
Prometheus finds at /metrics/targets (http_sd_targets); bench/metrics_scrape.py measures."""

from datetime import datetime, timezone

from django.db.models import Count, F
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily

from clusters.models import Cluster
from healthchecks.xid_catalog import xid_code
from healthchecks.models import HealthEvent
from notifications.models import Alert, Delivery
from repairs.choices import Status
from repairs.models import Repair

from nodes.choices import OUT_OF_SERVICE, NodeState
from nodes.live_store import get_live_store, stale_after_s
from nodes.models import Gpu, Node, PublisherStatus

from .series import render_gateway_series

MIB = 1024 * 1024

def ratio(percent):
    return None if percent is None else percent / 100


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
    # DCGM's profiling fields are ratios (0-1); the agent reports NVML's GPM in percent.
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.", "gauge",
     lambda g: ratio(g.get("gr_engine_active_pct"))),
    ("DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned.",
     "gauge", lambda g: ratio(g.get("sm_active_pct"))),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "The ratio of number of warps resident on an SM.", "gauge",
     lambda g: ratio(g.get("sm_occupancy_pct"))),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active.",
     "gauge", lambda g: ratio(g.get("tensor_active_pct"))),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active "
     "sending or receiving data.", "gauge", lambda g: ratio(g.get("dram_active_pct"))),
]
XID_SERIES = ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", "gauge")


def escape(value):
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


# A GPU's fields that its labels need, as render_dcgm reads them (no model objects: a
# 2,000-node cluster has 16,000 GPUs to label at every scrape).
GPU_LABEL_FIELDS = ("pk", "node_id", "index", "uuid", "pci_bus_id", "name", "node__hostname",
                    "node__name")


def labels(gpu, cluster_slug):
    """dcgm-exporter's labels of a GPU, from a row of GPU_LABEL_FIELDS."""
    _, _, index, uuid, pci_bus_id, name, hostname, node_name = gpu
    pairs = [("gpu", index), ("UUID", uuid), ("pci_bus_id", pci_bus_id),
             ("device", f"nvidia{index}"), ("modelName", name),
             ("Hostname", hostname or node_name), ("cluster", cluster_slug)]
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


ALL_CLUSTERS = None  # render_metrics' `clusters`: every cluster and the process's series
NO_CLUSTER = ""  # only the series of no cluster


def render_metrics(now_ts, cluster_slug=ALL_CLUSTERS):
    """The scrape: every cluster's series and those of no cluster (ALL_CLUSTERS), one
    cluster's (its slug), or only those of no cluster (NO_CLUSTER)."""
    clusters = Cluster.objects.only("slug")
    if cluster_slug is not ALL_CLUSTERS:
        clusters = clusters.filter(slug=cluster_slug)
    clusters = {cluster.pk: cluster for cluster in clusters}
    text = render_dcgm(now_ts, clusters) + render_console(now_ts, clusters)
    if cluster_slug in (ALL_CLUSTERS, NO_CLUSTER):
        text += render_process(now_ts)
    return text


def http_sd_targets(host):
    """Prometheus' http_sd: one target per cluster, and one for the series of no cluster."""
    targets = [{"targets": [host], "labels": {"__param_cluster": cluster.slug,
                                              "clusterui_scope": cluster.slug}}
               for cluster in Cluster.objects.only("slug").order_by("slug")]
    targets.append({"targets": [host], "labels": {"__param_cluster": NO_CLUSTER,
                                                  "clusterui_scope": "process"}})
    return targets


def render_dcgm(now_ts, clusters):
    store = get_live_store()
    gpus = Gpu.objects.filter(node__cluster_id__in=list(clusters)).values_list(
        *GPU_LABEL_FIELDS)
    by_node = {}
    for gpu in gpus:
        by_node.setdefault(gpu[1], {})[gpu[3]] = gpu
    xids = open_xids()
    lines = {name: [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
             for name, help_, kind, _ in GPU_SERIES}
    xid_lines = [f"# HELP {XID_SERIES[0]} {XID_SERIES[1]}", f"# TYPE {XID_SERIES[0]} gauge"]
    stale = stale_after_s()
    for cluster in clusters.values():
        for entry in store.read(cluster.pk).values():
            if now_ts - entry["received_at"] > stale:
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
                xid_lines.append(f"{XID_SERIES[0]}{{{label_text}}} {xids.get(gpu[0], 0)}")
    return "\n".join([*(line for series in lines.values() for line in series), *xid_lines]) + "\n"


# How long finished repairs took, started to finished (seconds).
REPAIR_DURATION_BUCKETS = (60, 300, 900, 1800, 3600, 7200, 14400)


class ConsoleCollector:
    """The console's own series, read from the database and the live store at each scrape."""

    def __init__(self, now_ts, clusters):
        self.now_ts = now_ts
        self.cluster_ids = list(clusters)

    def collect(self):
        clusters = {cluster.pk: cluster for cluster in
                    Cluster.objects.filter(pk__in=self.cluster_ids)}
        store = get_live_store()
        live = {cluster_id: store.read(cluster_id) for cluster_id in clusters}
        yield from self.nodes(clusters)
        yield self.open_events(clusters)
        yield from self.repairs(clusters)
        yield from self.live(clusters, live)
        yield from self.hygiene(clusters, live)
        yield from self.notifications(clusters)

    def nodes(self, clusters):
        nodes = GaugeMetricFamily("clusterui_nodes", "Nodes by state.",
                                  labels=["cluster", "state"])
        degraded = GaugeMetricFamily(
            "clusterui_cluster_degraded", "1 while more than the cluster's threshold of its "
            "nodes are out of service (paused or unhealthy).", labels=["cluster"])
        counts = {(row["cluster_id"], row["state"]): row["n"] for row in
                  Node.objects.values("cluster_id", "state").annotate(n=Count("pk"))}
        for cluster in clusters.values():
            total = out = 0
            for state in NodeState.values:
                n = counts.get((cluster.pk, state), 0)
                nodes.add_metric([cluster.slug, state], n)
                total += n
                out += n if state in OUT_OF_SERVICE else 0
            degraded.add_metric([cluster.slug], int(cluster.is_degraded(out, total)))
        return nodes, degraded

    def open_events(self, clusters):
        family = GaugeMetricFamily("clusterui_open_health_events", "Open health events.",
                                   labels=["cluster", "signature", "severity"])
        for row in (HealthEvent.objects.open().values("node__cluster_id", "signature", "severity")
                    .annotate(n=Count("pk"))):
            if row["node__cluster_id"] in clusters:  # not one made since the scrape began
                family.add_metric([clusters[row["node__cluster_id"]].slug, row["signature"],
                                   row["severity"]], row["n"])
        return family

    def repairs(self, clusters):
        by_status = GaugeMetricFamily("clusterui_repairs", "Repairs by status.",
                                      labels=["cluster", "status"])
        counts = {(row["cluster_id"], row["status"]): row["n"] for row in
                  Repair.objects.values("cluster_id", "status").annotate(n=Count("pk"))}
        for cluster in clusters.values():
            for status in Status.values:
                by_status.add_metric([cluster.slug, status], counts.get((cluster.pk, status), 0))
        durations = HistogramMetricFamily(
            "clusterui_repair_duration_seconds", "How long finished repairs ran, by action and "
            "outcome.", labels=["cluster", "action", "status"])
        finished = (Repair.objects.filter(started_at__isnull=False, finished_at__isnull=False)
                    .values_list("cluster_id", "action", "status", "started_at", "finished_at"))
        seconds = {}
        for cluster_id, action, status, started, ended in finished:
            seconds.setdefault((cluster_id, action, status), []).append(
                (ended - started).total_seconds())
        for (cluster_id, action, status), values in sorted(seconds.items()):
            if cluster_id not in clusters:
                continue
            buckets = [(str(edge), sum(v <= edge for v in values))
                       for edge in REPAIR_DURATION_BUCKETS] + [("+Inf", len(values))]
            durations.add_metric([clusters[cluster_id].slug, action, status], buckets,
                                 sum(values))
        return by_status, durations

    def live(self, clusters, live):
        connected = GaugeMetricFamily(
            "clusterui_connected_agents", "Nodes whose agent sent a sample recently (within "
            "three sample intervals).", labels=["cluster"])
        lag = GaugeMetricFamily(
            "clusterui_ingest_lag_seconds", "Age of the cluster's newest sample: grows when "
            "ingest stalls.", labels=["cluster"])
        stale = stale_after_s()
        for cluster in clusters.values():
            received = [entry["received_at"] for entry in live[cluster.pk].values()]
            connected.add_metric([cluster.slug],
                                 sum(self.now_ts - at <= stale for at in received))
            if received:
                lag.add_metric([cluster.slug], max(0.0, self.now_ts - max(received)))
        return connected, lag

    def hygiene(self, clusters, live):
        """Node hygiene's readings (sample.hygiene) of the nodes reporting now."""
        families = {
            "slurmd_up": GaugeMetricFamily(
                "clusterui_node_slurmd_up", "1 while the node's slurmd runs (its agent's "
                "reading).", labels=["cluster", "node"]),
            "slurmd_restarts": GaugeMetricFamily(
                "clusterui_node_slurmd_restarts", "Restarts of slurmd by the node's agent "
                "since the agent started.", labels=["cluster", "node"]),
            "zombies": GaugeMetricFamily(
                "clusterui_node_zombie_processes", "Zombie processes on the node.",
                labels=["cluster", "node"]),
            "pid_usage": GaugeMetricFamily(
                "clusterui_node_pid_usage_ratio", "Tasks on the node over its kernel's "
                "pid_max.", labels=["cluster", "node"]),
            "gres_match": GaugeMetricFamily(
                "clusterui_node_gres_match", "1 while Slurm's view of the node's GPUs matches "
                "NVML's.", labels=["cluster", "node"]),
        }
        names = dict(Node.objects.filter(cluster_id__in=clusters).values_list("pk", "name"))
        stale = stale_after_s()
        for cluster in clusters.values():
            for entry in live[cluster.pk].values():
                readings = entry.get("hygiene")
                name = names.get(entry["node_id"])
                if not readings or name is None or self.now_ts - entry["received_at"] > stale:
                    continue
                key = [cluster.slug, name]
                slurmd = readings.get("slurmd") or {}
                if slurmd.get("state") is not None:
                    families["slurmd_up"].add_metric(key, int(slurmd["state"] == "running"))
                if slurmd.get("restarts") is not None:
                    families["slurmd_restarts"].add_metric(key, slurmd["restarts"])
                processes = readings.get("processes") or {}
                if processes.get("zombies") is not None:
                    families["zombies"].add_metric(key, processes["zombies"])
                if processes.get("tasks") is not None and processes.get("pid_max"):
                    families["pid_usage"].add_metric(key, processes["tasks"] / processes["pid_max"])
                gres = readings.get("gres") or {}
                if gres.get("match") is not None:
                    families["gres_match"].add_metric(key, int(gres["match"]))
        return families.values()

    def notifications(self, clusters):
        firing = GaugeMetricFamily("clusterui_alerts_firing", "Alerts firing, by kind.",
                                   labels=["cluster", "kind"])
        for row in Alert.objects.firing().values("cluster_id", "kind").annotate(n=Count("pk")):
            if row["cluster_id"] in clusters:
                firing.add_metric([clusters[row["cluster_id"]].slug, row["kind"]], row["n"])
        deliveries = GaugeMetricFamily(
            "clusterui_notification_deliveries", "Notification deliveries by status (failed: "
            "gave up after every retry).", labels=["cluster", "channel", "status"])
        for row in (Delivery.objects.values(cluster_id=F("channel__cluster_id"),
                                            name=F("channel__name"), state=F("status"))
                    .annotate(n=Count("pk"))):
            if row["cluster_id"] in clusters:
                deliveries.add_metric([clusters[row["cluster_id"]].slug, row["name"],
                                       row["state"]], row["n"])
        return firing, deliveries


class ProcessCollector:
    """The series of no cluster: how long ago the live publisher ran."""

    def __init__(self, now_ts):
        self.now_ts = now_ts

    def collect(self):
        tick = GaugeMetricFamily("clusterui_publisher_tick_age_seconds",
                                 "Seconds since the live publisher last ran.")
        status = PublisherStatus.objects.order_by("-seen_at").first()
        if status is not None:
            now = datetime.fromtimestamp(self.now_ts, tz=timezone.utc)
            tick.add_metric([], max(0.0, (now - status.seen_at).total_seconds()))
        yield tick


def _render(collector):
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry).decode()


def render_console(now_ts, clusters):
    return _render(ConsoleCollector(now_ts, clusters))


def render_process(now_ts):
    """The series of no cluster: the publisher's, and this process's agent socket's."""
    return _render(ProcessCollector(now_ts)) + render_gateway_series()
