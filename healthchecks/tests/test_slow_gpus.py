"""The slow GPU rule (healthchecks/slow_gpus.py) on readings of a real H200.

The peers replay agent/data/h200/nvml_trace.json (a real H200 under a bf16 matmul,
99-100 % utilization, at its 700 W cap) in different phases. The slow GPU is one of those
readings with a GPU held at 1110 MHz, as a wrong 400 W power limit does: its clock event
reason is SW power cap (0x4), which is normal under load, so only its peers show it is slow.
"""

import json
from pathlib import Path

import pytest

from healthchecks.slow_gpus import Closing, SlowGpuLimits, SlowGpuWatch
from nodes.live_fold import GPU_AT_LOAD

TRACE = json.loads((Path(__file__).resolve().parents[2] / "agent" / "data" / "h200"
                    / "nvml_trace.json").read_text())


def reading(sample):
    """A trace sample as a live entry's GPU (the agent's simulated backend does the same)."""
    return {"util_pct": sample["utilization"]["gpu"], "sm_clock_mhz": sample["sm_clock_mhz"],
            "temp_c": sample["temperature_c"], "power_w": sample["power_mw"] / 1000,
            "clock_event_reasons": sample["clock_event_reasons"]}


AT_LOAD = [reading(s) for s in TRACE["samples"] if s["utilization"]["gpu"] >= 99]
IDLE = reading(next(s for s in TRACE["samples"] if s["utilization"]["gpu"] == 0))
CAPPED = {**AT_LOAD[20], "sm_clock_mhz": 1110, "power_w": 399.6}
SLOW = (1, "GPU-1-3")  # (node id, uuid) of the GPU that may be slow


def test_the_trace_is_what_the_defaults_were_chosen_from():
    clocks = sorted(gpu["sm_clock_mhz"] for gpu in AT_LOAD)
    assert len(clocks) >= 50 and clocks[len(clocks) // 2] in range(1455, 1471)
    assert {gpu["clock_event_reasons"] for gpu in AT_LOAD} == {4}
    assert (clocks[0], clocks[-1]) == (1260, 1530)  # the one dip: 86 % of the median
    assert IDLE["util_pct"] == 0


def entries(tick, *, nodes=2, slow=None, idle=()):
    """A tick's [(node id, GPUs)] as the publisher hands them over (nodes/live_fold.py):
    `nodes` nodes of 8 H200s at load; SLOW reads `slow` if given. Idle GPUs are kept in:
    the rule leaves them out itself."""
    result = []
    for node_id in range(1, nodes + 1):
        gpus = []
        for index in range(8):
            uuid = f"GPU-{node_id}-{index}"
            gpu = AT_LOAD[(tick + 7 * index + 3 * node_id) % len(AT_LOAD)]
            if (node_id, uuid) == SLOW and slow is not None:
                gpu = slow
            if (node_id, uuid) in idle:
                gpu = IDLE
            gpus.append(tuple({"uuid": uuid, **gpu}.get(field) for field in GPU_AT_LOAD))
        result.append((node_id, tuple(gpus)))
    return result


MODELS = {f"GPU-{node}-{index}": "NVIDIA H200" for node in range(1, 9) for index in range(8)}


def run(ticks, *, open_keys=(), models=MODELS, limits=SlowGpuLimits()):
    """Run the rule once a second; [(second, decision)]. An opening joins open_keys, as
    its event would; a closing leaves them."""
    watch = SlowGpuWatch(limits)
    open_keys = set(open_keys)
    decided = []
    for second, fleet in enumerate(ticks):
        openings, closings = watch.check(7, fleet, models, open_keys, 1_764_442_000.0 + second)
        for decision in openings + closings:
            decided.append((second, decision))
            key = (decision.node_id, decision.gpu_uuid)
            (open_keys.discard if isinstance(decision, Closing) else open_keys.add)(key)
    return [(second, type(decision).__name__, decision.gpu_uuid)
            for second, decision in decided]


def slow_for(seconds, then=None, then_for=0, **fleet):
    return ([entries(t, slow=CAPPED, **fleet) for t in range(seconds)]
            + [entries(seconds + t, slow=then, **fleet) for t in range(then_for)])


CASES = {
    "healthy peers only, all the trace's readings": (
        [entries(t) for t in range(180)], (), []),
    "too few peers at load (3 besides it)": (
        slow_for(120, nodes=1, idle={(1, f"GPU-1-{i}") for i in (4, 5, 6, 7)}), (), []),
    "slow for less than the hold time": (
        slow_for(60, then=AT_LOAD[0], then_for=60), (), []),
    "slow for the hold time opens, once": (
        slow_for(120), (), [(60, "Opening", "GPU-1-3")]),
    "idle for a tick starts the hold again": (
        slow_for(40, then=IDLE, then_for=1) + slow_for(59), (), []),
    "back in range for the clear time closes": (
        [entries(t) for t in range(90)], {SLOW}, [(60, "Closing", "GPU-1-3")]),
    "slow, then back: opens, then closes": (
        slow_for(100, then=AT_LOAD[5], then_for=70), (),
        [(60, "Opening", "GPU-1-3"), (160, "Closing", "GPU-1-3")]),
    "idle while open: stays open (not seen fast again)": (
        slow_for(0, then=IDLE, then_for=180), {SLOW}, []),
    "a recovery broken by a slow tick starts over": (
        [entries(t) for t in range(50)] + slow_for(1) + [entries(t) for t in range(59)],
        {SLOW}, []),
}


@pytest.mark.parametrize("ticks, open_keys, expected", CASES.values(), ids=CASES.keys())
def test_slow_gpu_rule(ticks, open_keys, expected):
    assert run(ticks, open_keys=open_keys) == expected


def test_only_gpus_of_the_same_model_are_peers():
    """Node 1 has H200s; node 2's GPUs are another model: node 1 alone has 7 peers for
    GPU-1-3, so it is judged, but an H100 node of 3 GPUs at load is not a peer group."""
    models = {**MODELS, **{f"GPU-2-{i}": "NVIDIA H100 80GB HBM3" for i in range(8)}}
    only_node_1_at_load = set()
    ticks = [entries(t, slow=CAPPED, idle=only_node_1_at_load) for t in range(61)]
    assert run(ticks, models=models) == [(60, "Opening", "GPU-1-3")]
    few_h200 = {(1, f"GPU-1-{i}") for i in (0, 1, 2, 4)}
    ticks = [entries(t, slow=CAPPED, idle=few_h200) for t in range(61)]
    assert run(ticks, models=models) == []  # 3 H200 peers; 8 H100s do not count


def test_a_gpu_of_unknown_model_is_not_judged():
    models = {uuid: model for uuid, model in MODELS.items() if uuid != SLOW[1]}
    assert run(slow_for(120), models=models) == []


def test_the_opening_carries_the_numbers():
    watch = SlowGpuWatch(SlowGpuLimits(hold_s=0))
    (opening,), closings = watch.check(7, entries(0, slow=CAPPED), MODELS, set(), 0.0)

    assert closings == []
    evidence = opening.evidence
    assert evidence["sm_clock_mhz"] == 1110 and evidence["peers"] == 15
    assert 1440 <= evidence["median_sm_clock_mhz"] <= 1485
    assert evidence["threshold_mhz"] == round(0.85 * evidence["median_sm_clock_mhz"], 1)
    assert (evidence["util_pct"], evidence["clock_event_reasons"]) == (CAPPED["util_pct"], 4)
    assert evidence["temp_c"] == CAPPED["temp_c"] and evidence["model"] == "NVIDIA H200"
    assert opening.message.startswith("SM clock 1110 MHz, 7")
    assert "of 16 NVIDIA H200 GPUs at 90 % utilization or more, for 0 s" in opening.message


def test_limits_come_from_the_caller():
    strict = SlowGpuLimits(clock_ratio=0.9, hold_s=5)
    just_below = {**AT_LOAD[0], "sm_clock_mhz": 1280}  # 88 % of 1462: slow at 90 %, not 85 %
    ticks = [entries(t, slow=just_below) for t in range(10)]
    assert run(ticks, limits=strict) == [(5, "Opening", "GPU-1-3")]
    assert run(ticks) == []


def test_clusters_keep_their_own_streaks():
    watch = SlowGpuWatch(SlowGpuLimits(hold_s=2))
    for second in range(3):
        opened, _ = watch.check(1, entries(second, slow=CAPPED), MODELS, set(), float(second))
        other, _ = watch.check(2, entries(second), MODELS, set(), float(second))
        assert other == []
    assert [o.gpu_uuid for o in opened] == ["GPU-1-3"]
