"""--inject: faults for the simulated backend, on a schedule.

    --inject xid:79@30s,thermal@60s+30s:gpu2,gpu_lost@90s

Each item is `<fault>@<seconds>s`, seconds after the agent started, optionally
followed by `:gpu<i>` (the GPU index; GPU 0 by default):

    xid:<code>@<s>s         an Xid event (critical) on that GPU
    thermal@<s>s[+<d>s]     HW thermal slowdown (clock event reason 0x40, temperature
                            up) for d seconds, or until the agent stops
    gpu_lost@<s>s           the GPU stops answering (a gpu_lost event; it leaves the
                            samples and the next hello)
"""

import re
from dataclasses import dataclass

_ITEM = re.compile(
    r"(?P<fault>xid:(?P<xid>[0-9]+)|thermal|gpu_lost)"
    r"@(?P<at>[0-9]+(?:\.[0-9]+)?)s"
    r"(?:\+(?P<duration>[0-9]+(?:\.[0-9]+)?)s)?"
    r"(?::gpu(?P<gpu>[0-9]+))?"
)

USAGE = (
    "expected comma-separated items like xid:79@30s, xid:48@10s:gpu3, thermal@60s, "
    "thermal@60s+30s:gpu1 or gpu_lost@90s"
)


class InjectSpecError(ValueError):
    pass


@dataclass(frozen=True)
class Fault:
    kind: str  # "xid", "thermal" or "gpu_lost"
    at_s: float  # seconds after the agent started
    gpu: int = 0  # the GPU's index
    xid: int | None = None  # kind "xid" only
    duration_s: float | None = None  # kind "thermal" only; None: until the agent stops


def parse_inject(spec):
    """The faults a --inject value names, in the order given."""
    faults = []
    for item in spec.split(","):
        item = item.strip()
        match = _ITEM.fullmatch(item)
        if match is None:
            raise InjectSpecError(f"bad --inject item {item!r}: {USAGE}")
        kind = "xid" if match["xid"] is not None else match["fault"]
        if match["duration"] is not None and kind != "thermal":
            raise InjectSpecError(
                f"bad --inject item {item!r}: only thermal takes a duration (+<d>s)"
            )
        if kind == "xid" and int(match["xid"]) == 0:
            raise InjectSpecError(f"bad --inject item {item!r}: Xid codes start at 1")
        if match["duration"] is not None and float(match["duration"]) == 0:
            raise InjectSpecError(f"bad --inject item {item!r}: the duration must be above 0 s")
        faults.append(
            Fault(
                kind=kind,
                at_s=float(match["at"]),
                gpu=int(match["gpu"]) if match["gpu"] is not None else 0,
                xid=int(match["xid"]) if kind == "xid" else None,
                duration_s=float(match["duration"]) if match["duration"] is not None else None,
            )
        )
    return faults


def check_gpu_indexes(faults, gpu_count):
    """Every fault names a GPU the simulated node has."""
    for fault in faults:
        if fault.gpu >= gpu_count:
            raise InjectSpecError(
                f"--inject names gpu{fault.gpu}, but the simulated node has {gpu_count} "
                f"GPUs (gpu0 to gpu{gpu_count - 1})"
            )
