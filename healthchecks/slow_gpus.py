"""Slow GPU, a passive rule on the server: a GPU much slower than its peers under the same load.

Pure: live samples in, decisions out; no database, no clock, no settings. The live publisher
(gateway/publisher.py) runs it once a second per cluster over the GPUs at load of every node's
latest sample (nodes/live_fold.py), and writes the decisions through the health event
services.

The rule, per cluster and GPU model (Gpu.name):
- comparable: a GPU at `min_util_pct` or more with an SM clock, when at least `min_peers`
  other GPUs of its model are too (fewer say nothing about "its peers");
- slow: its SM clock below `clock_ratio` of the median SM clock of the comparable GPUs of
  its model (itself included);
- slow on every tick for `hold_s`: `slow_gpu` opens (warning);
- an open one closes once the GPU was comparable and not slow on every tick for `clear_s`.
  A tick where it is not comparable (idle, too few peers at load, no fresh sample) breaks
  both streaks: a GPU that went idle has not shown it is fast again, so its event stays
  open; closing it there would flap with every job that ends.

Defaults, from the real H200 (shared/fixtures/nvml/h200/nvml_trace.json): under a bf16
matmul at 99-100 % utilization it runs at its 700 W power cap (clock event reason 0x4, which
is normal) with an SM clock of 1365-1530 MHz, median 1462 MHz, and a single dip to 1260 MHz
(86 %) while the load ramps up. 1980 MHz is its boost clock right after the load, at 0 %
utilization, never a clock under load. Below 85 % of the median (1243 MHz here) is slower
than any reading of a healthy GPU at work, and a 60 s hold leaves out such dips.

The hold state lives in the publisher's process: a new lease holder starts its streaks anew.
"""

import statistics
from dataclasses import dataclass, field

SLOW_GPU = "slow_gpu"


@dataclass(frozen=True)
class SlowGpuLimits:
    min_util_pct: float = 90.0
    clock_ratio: float = 0.85
    min_peers: int = 4
    hold_s: float = 60.0
    clear_s: float = 60.0


@dataclass(frozen=True)
class Opening:
    node_id: int
    gpu_uuid: str
    message: str
    evidence: dict


@dataclass(frozen=True)
class Closing:
    node_id: int
    gpu_uuid: str
    reason: str


@dataclass
class SlowGpuWatch:
    """The rule with its hold state: when each GPU's current streak began, per cluster."""

    limits: SlowGpuLimits = field(default_factory=SlowGpuLimits)
    slow_since: dict = field(default_factory=dict)  # cluster id -> {(node id, uuid): ts}
    back_since: dict = field(default_factory=dict)  # cluster id -> {(node id, uuid): ts}

    def check(self, cluster_id, nodes_at_load, models, open_keys, now_ts):
        """One tick of one cluster: ([Opening], [Closing]).

        nodes_at_load: [(node id, GPUs)] of the cluster's fresh samples, a GPU being a tuple
        (uuid, util_pct, sm_clock_mhz, temp_c, power_w, clock_event_reasons), as
        nodes.live_fold.GPU_AT_LOAD; GPUs below min_util_pct or without an SM clock may be
        left out (they say nothing). models: {GPU uuid: model name}; open_keys:
        {(node id, uuid)} of the open slow_gpu events.
        """
        limits = self.limits
        clocks = {}  # model -> SM clocks of its GPUs at load
        for _, gpus in nodes_at_load:
            for uuid, util, clock, *_ in gpus:
                if util is not None and util >= limits.min_util_pct and clock is not None:
                    model = models.get(uuid)
                    if model in clocks:
                        clocks[model].append(clock)
                    elif model:
                        clocks[model] = [clock]
        medians = {model: (statistics.median(values), len(values))
                   for model, values in clocks.items() if len(values) - 1 >= limits.min_peers}

        open_by_node = {}
        for node_id, uuid in open_keys:
            open_by_node.setdefault(node_id, set()).add(uuid)
        slow_since = self.slow_since.get(cluster_id, {})
        back_since = self.back_since.get(cluster_id, {})
        still_slow, still_back = {}, {}
        openings, closings = [], []
        highest = max((limits.clock_ratio * median for median, _ in medians.values()), default=0)
        for node_id, gpus in nodes_at_load if medians else ():
            open_here = open_by_node.get(node_id, ())
            for gpu in gpus:
                uuid, util, clock = gpu[:3]
                if clock is None or (clock >= highest and not open_here):
                    continue  # most GPUs: fast enough for any model, and nothing open
                if util is None or util < limits.min_util_pct:
                    continue
                model = models.get(uuid)
                if model not in medians:
                    continue
                median, compared = medians[model]
                if clock < limits.clock_ratio * median:
                    key = (node_id, uuid)
                    since = still_slow[key] = slow_since.get(key, now_ts)
                    if uuid not in open_here and now_ts - since >= limits.hold_s:
                        openings.append(self._opening(key, gpu, model, median, compared,
                                                      now_ts - since))
                elif uuid in open_here:
                    key = (node_id, uuid)
                    since = still_back[key] = back_since.get(key, now_ts)
                    if now_ts - since >= limits.clear_s:
                        closings.append(Closing(*key, reason=(
                            f"SM clock back above {limits.clock_ratio:.0%} of its peers' "
                            f"median for {limits.clear_s:g} s")))
        self.slow_since[cluster_id] = still_slow
        self.back_since[cluster_id] = still_back
        return openings, closings

    def _opening(self, key, gpu, model, median, compared, held_s):
        limits = self.limits
        _, util, clock, temp, power, reasons = gpu
        return Opening(*key, message=(
            f"SM clock {clock:g} MHz, {clock / median:.0%} of the median {median:g} MHz of "
            f"{compared} {model} GPUs at {limits.min_util_pct:g} % utilization or more, "
            f"for {held_s:.0f} s"), evidence={
            "model": model,
            "sm_clock_mhz": clock,
            "median_sm_clock_mhz": median,
            "threshold_mhz": round(limits.clock_ratio * median, 1),
            "peers": compared - 1,
            "util_pct": util,
            "temp_c": temp,
            "power_w": power,
            "clock_event_reasons": reasons,
            "held_s": round(held_s, 1),
        })
