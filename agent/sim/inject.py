"""--inject: faults for the simulated backend, on a schedule.

    --inject xid:79@30s,thermal@60s+30s:gpu2,gpu_lost@90s

Each item is `<fault>@<seconds>s`, seconds after the agent started, optionally
followed by `:gpu<i>` (the GPU index; GPU 0 by default):

    xid:<code>@<s>s         one real-format NVRM Xid line in the simulated kernel log
                            (the Xid watcher makes it an `xid:<code>` event)
    xid_storm:<code>@<s>s   10,000 identical Xid lines at once (a storm: a few events
                            whose counts sum to 10,000)
    thermal@<s>s[+<d>s]     HW thermal slowdown (clock event reason 0x40, temperature
                            up) for d seconds, or until the agent stops (the throttle
                            watcher raises `thermal_throttle` once it held 10 s, and
                            clears it when it ends)
    ecc_dbe@<s>s            one more volatile double-bit ECC error on the GPU (the ECC
                            watcher raises `ecc_dbe`)
    gpu_lost@<s>s           the GPU stops answering (a gpu_lost event; it leaves the
                            samples and the next hello)

Node hygiene's faults (agent/hygiene/simulated.py), on the node rather than a GPU:

    gres_drift@<s>s         Slurm's view of the node loses its last GPU (gres_drift, until
                            the server's reconfigure)
    zombies@<s>s            25 zombies under one leaking parent (zombie_processes, until
                            the server's cleanup)
    slurmd_flap@<s>s        slurmd dies three times, 20 s apart (three slurmd_restarted
                            notices, then slurmd_flapping)
    job_leftovers@<s>s      a job ends leaving a process on the GPU (job_cleanup, then
                            job_leftovers until a reboot)
"""

import re
from dataclasses import dataclass

XID_STORM_LINES = 10_000

_ITEM = re.compile(
    r"(?P<fault>xid:(?P<xid>[0-9]+)|xid_storm:(?P<storm>[0-9]+)|thermal|ecc_dbe|gpu_lost"
    r"|gres_drift|zombies|slurmd_flap|job_leftovers)"
    r"@(?P<at>[0-9]+(?:\.[0-9]+)?)s"
    r"(?:\+(?P<duration>[0-9]+(?:\.[0-9]+)?)s)?"
    r"(?::gpu(?P<gpu>[0-9]+))?"
)

USAGE = (
    "expected comma-separated items like xid:79@30s, xid:48@10s:gpu3, thermal@60s, "
    "thermal@60s+30s:gpu1, xid_storm:13@20s, ecc_dbe@40s:gpu2, gpu_lost@90s, "
    "gres_drift@30s, zombies@30s, slurmd_flap@30s or job_leftovers@30s:gpu1"
)
# The faults of node hygiene (agent/hygiene/simulated.py); the rest are the GPUs'.
HYGIENE_FAULTS = ("gres_drift", "zombies", "slurmd_flap", "job_leftovers")


class InjectSpecError(ValueError):
    pass


@dataclass(frozen=True)
class Fault:
    kind: str  # "xid", "xid_storm", "thermal", "ecc_dbe", "gpu_lost", or a HYGIENE_FAULTS
    at_s: float  # seconds after the agent started
    gpu: int = 0  # the GPU's index
    xid: int | None = None  # kinds "xid" and "xid_storm" only
    duration_s: float | None = None  # kind "thermal" only; None: until the agent stops

    @property
    def label(self):
        """"xid:79", "thermal", "gpu_lost"...: how the agent's log names the fault."""
        return f"{self.kind}:{self.xid}" if self.xid is not None else self.kind


def parse_inject(spec):
    """The faults a --inject value names, in the order given."""
    faults = []
    for item in spec.split(","):
        item = item.strip()
        match = _ITEM.fullmatch(item)
        if match is None:
            raise InjectSpecError(f"bad --inject item {item!r}: {USAGE}")
        if match["xid"] is not None:
            kind, code = "xid", int(match["xid"])
        elif match["storm"] is not None:
            kind, code = "xid_storm", int(match["storm"])
        else:
            kind, code = match["fault"], None
        if match["duration"] is not None and kind != "thermal":
            raise InjectSpecError(
                f"bad --inject item {item!r}: only thermal takes a duration (+<d>s)"
            )
        if code == 0:
            raise InjectSpecError(f"bad --inject item {item!r}: Xid codes start at 1")
        if match["duration"] is not None and float(match["duration"]) == 0:
            raise InjectSpecError(f"bad --inject item {item!r}: the duration must be above 0 s")
        faults.append(
            Fault(
                kind=kind,
                at_s=float(match["at"]),
                gpu=int(match["gpu"]) if match["gpu"] is not None else 0,
                xid=code,
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
