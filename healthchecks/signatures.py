"""The catalog of health signatures, loaded as data (healthchecks/data/signatures.tsv): what
each one means, where it comes from, how it closes (DESIGN.md "Health" and "Node hygiene";
agent/README.md has the agent's side), and its default ladder of repairs with why its first
rung fixes it and why nothing lighter is enough (DESIGN.md "Repairs"; repairs.policy reads
them). Xids are one entry here; their meanings and ladders come from NVIDIA's catalog by
action bucket (healthchecks.xid_catalog).

A *notice* records a happening, not a condition: slurmd restarted, a job's leftovers
cleaned. Each one is its own event, closed as it is recorded (healthchecks.services), so the
node's timeline shows every one; nothing stays open, and the node's state does not change.
"""

import csv
from dataclasses import dataclass
from functools import cache

from .xid_catalog import DATA

AGENT, SERVER, CHECK = "agent", "server", "check"
HELD, EDGE, NOTICE = "held", "edge", "notice"


@dataclass(frozen=True)
class SignatureInfo:
    """One row of healthchecks/data/signatures.tsv."""

    signature: str  # "gpu_lost"; "xid:<code>" and "check:<name>" stand for their families
    source: str  # AGENT, SERVER or CHECK
    kind: str  # HELD (lasts while its signal does), EDGE (happened once) or NOTICE
    meaning: str
    closes: str
    ladder: tuple  # repair actions, cheapest first; () for none (repairs.policy)
    why: str  # why the ladder's first rung fixes it, or why there is no repair
    lighter: str  # why nothing lighter than the first rung is enough; "" for the lightest
    peak: str  # the live metric whose peak a held signal shows (temp_c, power_w), or ""
    drain: str  # the default drain mode of its rungs that take the node out, or ""

    @property
    def notice(self):
        return self.kind == NOTICE


@cache
def signatures():
    """{signature: SignatureInfo}, in the file's order."""
    with open(DATA / "signatures.tsv", newline="") as f:
        return {row["signature"]: SignatureInfo(
                    row["signature"], row["source"], row["kind"], row["meaning"],
                    row["closes"], tuple(row["ladder"].split()), row["why"], row["lighter"],
                    row["peak"], row["drain"])
                for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)}


SIGNATURES = signatures()
NOTICES = frozenset(name for name, info in SIGNATURES.items() if info.notice)


def family_of(signature):
    """The catalog's key for a signature: xid:79 -> "xid:<code>", check:x -> "check:<name>"."""
    kind, colon, _ = signature.partition(":")
    if not colon:
        return signature
    return f"{kind}:<code>" if kind == "xid" else f"{kind}:<name>"


def info_for(signature):
    """The catalog entry of a signature (xid:79 -> "xid:<code>"), or None."""
    return SIGNATURES.get(family_of(signature))


def is_notice(signature):
    return signature in NOTICES
