"""NVIDIA's Xid catalog, loaded as data (healthchecks/data/xid_catalog.tsv), and DESIGN.md's
table that turns an Xid's immediate-action bucket into severity and a ladder of repairs,
loaded as data too (healthchecks/data/xid_buckets.tsv: one row per bucket, with NVIDIA's
action in plain words and why the first rung of the ladder fixes it).

CONTACT_SUPPORT and CHECK_MECHANICALS ask for a removal only for codes that the catalog
says apply to the GPU's model; elsewhere they are a warning without a repair.
"""

import csv
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
BLANK_BUCKET = "(blank in catalog)"

INFO, WARNING, CRITICAL = "info", "warning", "critical"
REBOOT, REMOVE = "reboot", "remove"
# Buckets that blame the hardware: they count against a GPU only of a model they apply to.
HARDWARE_BUCKETS = ("CONTACT_SUPPORT", "CHECK_MECHANICALS")

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

    @property
    def nvidia(self):
        """NVIDIA's action in words: "NVIDIA: restart the machine (RESTART_BM)"."""
        return f"NVIDIA: {rule_for(self.bucket).nvidia_says} ({self.bucket or 'no bucket'})"


@dataclass(frozen=True)
class BucketRule:
    """One row of xid_buckets.tsv."""

    bucket: str
    severity: str
    ladder: tuple  # repair actions, cheapest first; () for none
    nvidia_says: str  # NVIDIA's action in plain words
    why: str  # why the first rung fixes it (or why there is none)
    lighter: str  # why nothing lighter is enough


@dataclass(frozen=True)
class XidPolicy:
    severity: str
    ladder: tuple
    nvidia: str  # "NVIDIA: restart the machine (RESTART_BM)"
    why: str
    lighter: str = ""

    @property
    def recommendation(self):
        """The ladder's first rung: the lightest repair that can fix it; None for none."""
        return self.ladder[0] if self.ladder else None


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


@cache
def bucket_rules():
    """{bucket: BucketRule}; "" is the blank bucket, "*" any bucket without a row."""
    with open(DATA / "xid_buckets.tsv", newline="") as f:
        return {row["bucket"]: BucketRule(row["bucket"], row["severity"],
                                          tuple(row["ladder"].split()), row["nvidia_says"],
                                          row["why"], row["lighter"])
                for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)}


def rule_for(bucket):
    rules = bucket_rules()
    return rules.get(bucket, rules["*"])


def policy_for(code, gpu_model=""):
    """Severity, ladder and why for Xid `code` on a GPU of `gpu_model`."""
    entry = catalog().get(code)
    if entry is None:
        return XidPolicy(WARNING, (), "NVIDIA: not in the catalog",
                         f"No repair by default: Xid {code} is not in NVIDIA's catalog; an "
                         f"operator decides.")
    rule = rule_for(entry.bucket)
    nvidia = entry.nvidia
    if entry.bucket in HARDWARE_BUCKETS and not applies_to(entry, gpu_model):
        return XidPolicy(WARNING, (), nvidia,
                         f"No repair: NVIDIA's catalog says Xid {code} does not apply to "
                         f"{gpu_model}, so it is not held against the GPU.")
    return XidPolicy(rule.severity, rule.ladder, nvidia, rule.why, rule.lighter)


GPUD_ACTIONS = {"REBOOT_SYSTEM": REBOOT, "HARDWARE_INSPECTION": REMOVE,
                "CHECK_USER_APP_AND_GPU": None, "IGNORE_NO_ACTION_REQUIRED": None}
GPUD_WORDS = {"REBOOT_SYSTEM": "a reboot", "HARDWARE_INSPECTION": "a hardware inspection",
              "CHECK_USER_APP_AND_GPU": "checking the application and the GPU",
              "IGNORE_NO_ACTION_REQUIRED": "no action"}


def gpud_differs(entry, policy):
    """gpud's view in words where it suggests something else than our first rung, else ""
    (also when gpud has no view of the code)."""
    if not entry.gpud_actions:
        return ""
    if policy.recommendation in {GPUD_ACTIONS.get(action) for action in entry.gpud_actions}:
        return ""
    words = " or ".join(GPUD_WORDS.get(action, action) for action in entry.gpud_actions)
    return f"gpud differs: it suggests {words}."


def applies_text(entry):
    """The GPU generations the catalog says the code applies to, in words."""
    names = [column.removeprefix("applies_") for column, yes in entry.applies.items() if yes]
    return f"for {', '.join(names)}-class GPUs" if names else "for none of the listed GPU classes"


def why_sentence(code, gpu_model=""):
    """What an operator reads on a card and the policy page: NVIDIA's action in words, the
    GPUs it applies to, why our first rung, and gpud's view where it differs."""
    entry = catalog().get(code)
    policy = policy_for(code, gpu_model)
    if entry is None:
        return policy.why
    parts = [f"{policy.nvidia}, {applies_text(entry)}.", policy.why, gpud_differs(entry, policy)]
    return " ".join(part for part in parts if part)


@dataclass(frozen=True)
class RecoveryAction:
    """One row of recovery_actions.tsv: an NVML GPU recovery action."""

    value: int
    name: str
    nvidia_says: str
    ladder: tuple
    why: str


@cache
def recovery_actions():
    """{value: RecoveryAction} for NVML's GPU recovery actions."""
    with open(DATA / "recovery_actions.tsv", newline="") as f:
        return {int(row["value"]): RecoveryAction(int(row["value"]), row["name"],
                                                  row["nvidia_says"], tuple(row["ladder"].split()),
                                                  row["why"])
                for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)}


def recovery_action_of(evidence):
    """The RecoveryAction an Xid 154 (its kernel line's "to 0x2 (...)") or a
    gpu_recovery_action event (NVML's field) names, or None."""
    value = evidence.get("recovery_action", evidence.get("action"))
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    return recovery_actions().get(value)


NVLINK = re.compile(r"\blink (?P<link>\d+)\b", re.IGNORECASE)


def nvlink_of(event_text):
    """The NVLink an Xid 74 line names ("NVLink: fatal error detected on link 14(...)"),
    or None."""
    match = NVLINK.search(event_text or "")
    return int(match["link"]) if match else None
