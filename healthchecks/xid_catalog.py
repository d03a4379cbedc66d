"""NVIDIA's Xid catalog, loaded as data (healthchecks/data/xid_catalog.tsv), and DESIGN.md's
table that turns an Xid's immediate-action bucket into severity and a default repair:

    IGNORE, RESTART_APP, CHECK_APP/CUDA, INVESTIGATE_SW*, informational or sympathetic,
    XID_154_EVAL                                  info      node stays healthy   no repair
    RESET_GPU, RESTART_BM, RESTART_VM, XID_154,
    WORKFLOW_*                                    critical  unhealthy            reboot
    UPDATE_SWFW                                   critical  unhealthy            reprovision
    CONTACT_SUPPORT, CHECK_MECHANICALS            critical  unhealthy            remove (RMA),
                                                  only for codes that apply to the GPU's model
    blank                                         warning   unhealthy            none: "no NVIDIA
                                                                                  guidance"
"""

import csv
from dataclasses import dataclass
from functools import cache
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
BLANK_BUCKET = "(blank in catalog)"

INFO, WARNING, CRITICAL = "info", "warning", "critical"
REBOOT, REPROVISION, REMOVE = "reboot", "reprovision", "remove"

# The catalog's GPU-generation columns, and the model names each covers.
GENERATIONS = {
    "applies_A100": ("A100", "A800", "A30", "A10"),
    "applies_H100": ("H100", "H200", "H800", "H20", "GH200"),
    "applies_B100": ("B100", "B200", "B300"),
    "applies_GB200": ("GB200", "GB300"),
}


@dataclass(frozen=True)
class XidEntry:
    code: int
    mnemonic: str
    description: str
    bucket: str  # NVIDIA's immediate action; "" where the catalog gives none
    investigatory_bucket: str
    applies: dict  # catalog column -> bool
    gpud_event_type: str
    gpud_actions: tuple
    trigger: str

    @property
    def guidance(self):
        """NVIDIA's text for the immediate action bucket."""
        return bucket_texts().get(self.bucket, "")


@dataclass(frozen=True)
class XidPolicy:
    severity: str
    recommendation: str | None  # reboot, reprovision, remove, or None
    explanation: str


@cache
def catalog():
    """{code: XidEntry} for every code in the catalog."""
    entries = {}
    with open(DATA / "xid_catalog.tsv", newline="") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            bucket = row["immediate_action_bucket"].strip()
            entries[int(row["code"])] = XidEntry(
                code=int(row["code"]),
                mnemonic=row["mnemonic"],
                description=row["description"],
                bucket="" if bucket == BLANK_BUCKET else bucket,
                investigatory_bucket=row["investigatory_action_bucket"],
                applies={column: row[column] == "YES" for column in GENERATIONS},
                gpud_event_type=row["gpud_event_type"],
                gpud_actions=tuple(a for a in row["gpud_suggested_repair_actions"].split(",") if a),
                trigger=row["trigger_conditions_excerpt"],
            )
    return entries


@cache
def bucket_texts():
    with open(DATA / "xid_resolution_buckets.tsv", newline="") as f:
        return {row["Guidance Class"]: row["Resolution Action"]
                for row in csv.DictReader(f, delimiter="\t")}


def generation_of(gpu_model):
    """The catalog column for a GPU model name ("NVIDIA H200" -> applies_H100), or None."""
    name = gpu_model.upper()
    # Longest names first: "GB200" must not be taken for "B200".
    pairs = sorted(((m, col) for col, models in GENERATIONS.items() for m in models),
                   key=lambda pair: -len(pair[0]))
    for model, column in pairs:
        if model in name:
            return column
    return None


def applies_to(entry, gpu_model):
    """Whether the catalog says this Xid applies to the model (unknown models: it does)."""
    column = generation_of(gpu_model or "")
    return True if column is None else entry.applies[column]


def xid_code(signature):
    """The Xid code of an `xid:<code>` signature (ASCII digits only), or None."""
    kind, _, code = signature.partition(":")
    if kind == "xid" and code.isascii() and code.isdigit():
        return int(code)
    return None


def policy_for(code, gpu_model=""):
    """Severity and default recommendation for Xid `code` on a GPU of `gpu_model`."""
    entry = catalog().get(code)
    if entry is None:
        return XidPolicy(WARNING, None, f"Xid {code} is not in NVIDIA's catalog")
    bucket = entry.bucket
    if not bucket:
        return XidPolicy(WARNING, None, "no NVIDIA guidance")
    if bucket in ("RESET_GPU", "RESTART_BM", "RESTART_VM", "XID_154") or bucket.startswith(
            "WORKFLOW_"):
        return XidPolicy(CRITICAL, REBOOT, entry.guidance)
    if bucket == "UPDATE_SWFW":
        return XidPolicy(CRITICAL, REPROVISION, entry.guidance)
    if bucket in ("CONTACT_SUPPORT", "CHECK_MECHANICALS"):
        if applies_to(entry, gpu_model):
            return XidPolicy(CRITICAL, REMOVE, entry.guidance)
        return XidPolicy(WARNING, None,
                         f"NVIDIA's catalog says Xid {code} does not apply to {gpu_model}")
    # IGNORE, RESTART_APP, CHECK_APP/CUDA, INVESTIGATE_SW*, informational or sympathetic
    # ones, XID_154_EVAL, and CHECK_UVM (RESET_GPU only under UVM/vGPU, which nodes here
    # do not run): the application's problem.
    return XidPolicy(INFO, None, entry.guidance)
