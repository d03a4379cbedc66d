"""The throttle watcher against the real H200's readings (through the NVML backend and
the fake pynvml), with NVML's clock event reason bits set where a fault would set them."""

import pytest

from agent.backends.nvml import NvmlBackend
from agent.detectors.throttle import ThrottleWatcher, throttle_signatures
from agent.tests.fake_pynvml import FakeNvml, load_trace, trace_load_sample


class Clock:
    def __init__(self):
        self.now = 500.0

    def __call__(self):
        return self.now


@pytest.fixture
def h200():
    """(fake, backend): the real H200 under its bf16 matmul load, 2 GPUs."""
    fake = FakeNvml(dynamic=dict(trace_load_sample()), gpu_count=2)
    backend = NvmlBackend(nvml=fake)
    yield fake, backend
    backend.close()


def poll_at(watcher, clock, seconds, readings):
    clock.now = 500.0 + seconds
    return watcher.poll(readings)


def with_reasons(readings, index, reasons, temp_c=None):
    changed = [dict(gpu) for gpu in readings]
    changed[index]["clock_event_reasons"] = reasons
    if temp_c is not None:
        changed[index]["temp_c"] = temp_c
    return changed


def test_the_whole_real_trace_raises_nothing(h200):
    # Idle (reason 1), load at the 700 W limit (4: SW power cap) and cooling (0).
    fake, backend = h200
    clock = Clock()
    watcher = ThrottleWatcher(clock=clock)
    seen_reasons = set()

    for second, sample in enumerate(load_trace()["samples"]):
        fake.dynamic = sample
        readings = backend.read_gpus()
        seen_reasons.add(readings[0]["clock_event_reasons"])
        assert poll_at(watcher, clock, second, readings) == []

    assert seen_reasons == {0, 1, 4}


def test_sw_power_cap_under_load_is_never_a_fault(h200):
    _, backend = h200
    clock = Clock()
    watcher = ThrottleWatcher(hold_s=1, clock=clock)
    readings = backend.read_gpus()
    assert readings[0]["clock_event_reasons"] == 4

    assert [poll_at(watcher, clock, second, readings) for second in range(100)] == [[]] * 100


def test_hw_thermal_slowdown_held_for_10_s_opens_and_its_end_clears(h200):
    _, backend = h200
    clock = Clock()
    watcher = ThrottleWatcher(clock=clock)
    load = backend.read_gpus()
    hot = with_reasons(load, 1, 4 | 0x40, temp_c=91)  # as the simulated thermal fault

    for second in range(10):
        assert poll_at(watcher, clock, second, hot) == []
    [active] = poll_at(watcher, clock, 10, hot)
    assert poll_at(watcher, clock, 11, hot) == []
    [cleared] = poll_at(watcher, clock, 12, load)
    assert poll_at(watcher, clock, 13, load) == []

    assert (active["signature"], active["severity"], active["state"]) == (
        "thermal_throttle",
        "warning",
        "active",
    )
    assert active["gpu_uuid"] == load[1]["uuid"]
    assert active["message"] == ("thermal slowdown held for 10 s (clock event reasons: "
                                 "SW power cap, HW thermal slowdown)")  # words, not 0x44
    assert active["detail"] == {
        "clock_event_reasons": 0x44,
        "temp_c": 91,
        "sm_clock_mhz": 1455,  # the real H200's SM clock in that sample
        "held_s": 10.0,
    }
    assert (cleared["signature"], cleared["gpu_uuid"], cleared["state"]) == (
        "thermal_throttle",
        active["gpu_uuid"],
        "cleared",
    )
    assert cleared["id"] != active["id"]
    assert cleared["detail"]["clock_event_reasons"] == 4
    assert cleared["detail"]["held_s"] == 12.0


def test_throttling_shorter_than_the_hold_raises_nothing(h200):
    _, backend = h200
    clock = Clock()
    watcher = ThrottleWatcher(clock=clock)
    load = backend.read_gpus()
    hot = with_reasons(load, 0, 0x40)

    events = [poll_at(watcher, clock, s, hot if s < 9 else load) for s in range(30)]

    assert events == [[]] * 30


def test_one_sample_without_the_bit_restarts_the_hold(h200):
    _, backend = h200
    clock = Clock()
    watcher = ThrottleWatcher(hold_s=5, clock=clock)
    load = backend.read_gpus()
    hot = with_reasons(load, 0, 0x40)

    timeline = [hot] * 4 + [load] + [hot] * 5
    events = [poll_at(watcher, clock, s, readings) for s, readings in enumerate(timeline)]

    assert sum(events, []) == []
    [active] = poll_at(watcher, clock, 10, hot)  # 5 s after it came back at 5
    assert active["detail"]["held_s"] == 5.0


def test_the_hold_is_configurable(h200):
    _, backend = h200
    clock = Clock()
    watcher = ThrottleWatcher(hold_s=2.5, clock=clock)
    hot = with_reasons(backend.read_gpus(), 0, 0x80)

    assert poll_at(watcher, clock, 0, hot) == []
    assert poll_at(watcher, clock, 2.4, hot) == []
    [active] = poll_at(watcher, clock, 2.5, hot)
    assert active["signature"] == "power_brake"


def test_each_gpu_and_each_cause_is_held_on_its_own(h200):
    _, backend = h200
    clock = Clock()
    watcher = ThrottleWatcher(hold_s=1, clock=clock)
    load = backend.read_gpus()
    both = with_reasons(with_reasons(load, 0, 0x8), 1, 0x20 | 0x80)

    poll_at(watcher, clock, 0, both)
    events = poll_at(watcher, clock, 1, both)

    assert sorted((e["signature"], e["gpu_uuid"]) for e in events) == sorted(
        [
            ("hw_slowdown", load[0]["uuid"]),
            ("thermal_throttle", load[1]["uuid"]),
            ("power_brake", load[1]["uuid"]),
        ]
    )


def test_a_gpu_without_a_reading_keeps_its_state(h200):
    # A lost GPU leaves the samples: its throttling is not "cleared".
    _, backend = h200
    clock = Clock()
    watcher = ThrottleWatcher(hold_s=1, clock=clock)
    load = backend.read_gpus()
    hot = with_reasons(load, 0, 0x40)
    poll_at(watcher, clock, 0, hot)
    assert len(poll_at(watcher, clock, 1, hot)) == 1

    assert poll_at(watcher, clock, 2, hot[1:]) == []
    assert poll_at(watcher, clock, 3, with_reasons(load, 0, None)) == []
    assert poll_at(watcher, clock, 4, hot) == []  # still the same open event


@pytest.mark.parametrize(
    "reasons, signatures",
    [
        (0x0, set()),
        (0x1, set()),  # idle
        (0x4, set()),  # SW power cap: a GPU at its power limit
        (0x1 | 0x4, set()),
        (0x20, {"thermal_throttle"}),  # SW thermal
        (0x40, {"thermal_throttle"}),  # HW thermal
        (0x8 | 0x40, {"thermal_throttle"}),  # HW slowdown, explained by HW thermal
        (0x80, {"power_brake"}),
        (0x8 | 0x80, {"power_brake"}),  # HW slowdown, explained by the power brake
        (0x8, {"hw_slowdown"}),  # HW slowdown, no more specific cause
        (0x4 | 0x8, {"hw_slowdown"}),
        (0x20 | 0x80, {"thermal_throttle", "power_brake"}),
    ],
)
def test_throttle_signatures(reasons, signatures):
    assert throttle_signatures(reasons) == signatures


def test_clock_event_reasons_in_words():
    from agent.backends import clock_event_names

    assert clock_event_names(0x0) == "none"
    assert clock_event_names(0x1) == "idle"
    assert clock_event_names(0x8 | 0x80) == "HW slowdown, HW power brake slowdown"
    assert clock_event_names(0x4 | 0x1000) == "SW power cap, 0x1000"  # a bit NVML adds later
