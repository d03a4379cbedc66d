"""The active checks the server can ask of an agent (PROTOCOL.md `run_check`), and their
baselines per GPU model (healthchecks/data/check_baselines.tsv).

The server owns the numbers, the agent owns the measuring: each run's params carry the
thresholds for the node's GPU model, and the agent compares and says passed or failed.
"""

import csv
from dataclasses import dataclass
from functools import cache

from .xid_catalog import DATA


@dataclass(frozen=True)
class Check:
    name: str
    label: str
    description: str
    deadline_s: int  # no result by then (the node offline, a hung check): timed out


CHECKS = {
    check.name: check
    for check in (
        Check("nvml_sanity", "NVML sanity",
              "every GPU present, ECC on, PCIe link as expected, no row-remap failure", 120),
        Check("gpu_compute", "GPU compute", "bf16 matrix-multiply throughput per GPU", 900),
        Check("gpu_memory_bandwidth", "GPU memory bandwidth",
              "device-to-device copy throughput per GPU", 600),
        Check("storage", "Scratch storage", "write and read throughput of the scratch disk", 900),
        Check("nccl", "NCCL all-reduce",
              "all-reduce bus bandwidth across the node's GPUs (needs nccl-tests)", 900),
    )
}

# Run, in this order, on a new or reprovisioned node of a cluster with acceptance tests on.
ACCEPTANCE_CHECKS = ("nvml_sanity", "gpu_compute", "gpu_memory_bandwidth", "storage")


def acceptance_battery(cluster):
    """The checks a new node of the cluster passes, in ACCEPTANCE_CHECKS' order then the
    rest: the cluster's choice (Cluster.acceptance_checks), else the default."""
    chosen = [name for name in cluster.acceptance_checks.split() if name in CHECKS]
    return tuple(chosen) or ACCEPTANCE_CHECKS


# Run after a reboot of a node with open Xid / lost-GPU events; passing closes them.
AFTER_REBOOT_CHECKS = ("nvml_sanity", "gpu_compute")


@dataclass(frozen=True)
class Baseline:
    gpu_model: str
    check: str
    param: str
    expected: float
    tolerance_pct: float
    source: str

    @property
    def threshold(self):
        if self.param.startswith("min_"):
            return round(self.expected * (1 - self.tolerance_pct / 100), 3)
        return self.expected


@cache
def baselines():
    with open(DATA / "check_baselines.tsv", newline="") as f:
        return [
            Baseline(row["gpu_model"], row["check"], row["param"], float(row["expected"]),
                     float(row["tolerance_pct"]), row["source"])
            for row in csv.DictReader(f, delimiter="\t")
        ]


def params_for(check_name, gpu_models, gpu_count):
    """run_check params for a node whose GPUs are of `gpu_models` (a set of NVML names).

    Thresholds only where all the node's GPUs are of one model with a baseline."""
    params = {}
    if check_name == "nvml_sanity" and gpu_count:
        params["expected_gpus"] = gpu_count
    if len(gpu_models) == 1:
        [model] = gpu_models
        for baseline in baselines():
            if baseline.gpu_model == model and baseline.check == check_name:
                value = baseline.threshold
                params[baseline.param] = int(value) if value == int(value) else value
    return params


def baseline_rows_for(gpu_model):
    return [b for b in baselines() if b.gpu_model == gpu_model]
