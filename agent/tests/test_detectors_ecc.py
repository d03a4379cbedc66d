"""The ECC watcher against the real H200's readings (volatile DBE count 0), with the
count raised where a double-bit error would raise it."""

import pytest

from agent.backends.nvml import NvmlBackend
from agent.detectors.ecc import ECC_QUIET_S, EccWatcher
from agent.tests.fake_pynvml import FakeNvml


class Clock:
    def __init__(self):
        self.now = 500.0

    def __call__(self):
        return self.now


@pytest.fixture
def readings():
    """The real idle H200's readings, 2 GPUs."""
    backend = NvmlBackend(nvml=FakeNvml(gpu_count=2))
    yield backend.read_gpus()
    backend.close()


def poll_at(watcher, clock, seconds, readings):
    clock.now = 500.0 + seconds
    return watcher.poll(readings)


def with_dbe(readings, index, count):
    changed = [dict(gpu) for gpu in readings]
    changed[index]["ecc_dbe_volatile"] = count
    return changed


def test_the_real_count_of_0_raises_nothing(readings):
    clock = Clock()
    watcher = EccWatcher(clock=clock)
    assert {gpu["ecc_dbe_volatile"] for gpu in readings} == {0}

    assert [poll_at(watcher, clock, s, readings) for s in range(5)] == [[]] * 5


def test_a_rising_count_opens_with_before_and_after_and_clears_after_the_quiet_time(readings):
    clock = Clock()
    watcher = EccWatcher(quiet_s=600, clock=clock)
    poll_at(watcher, clock, 0, readings)

    [active] = poll_at(watcher, clock, 1, with_dbe(readings, 1, 2))
    assert poll_at(watcher, clock, 2, with_dbe(readings, 1, 2)) == []
    assert poll_at(watcher, clock, 600.9, with_dbe(readings, 1, 2)) == []
    [cleared] = poll_at(watcher, clock, 601, with_dbe(readings, 1, 2))
    assert poll_at(watcher, clock, 5000, with_dbe(readings, 1, 2)) == []

    assert (active["signature"], active["severity"], active["state"]) == (
        "ecc_dbe",
        "critical",
        "active",
    )
    assert active["gpu_uuid"] == readings[1]["uuid"]
    assert active["detail"] == {"before": 0, "after": 2}
    assert (cleared["signature"], cleared["gpu_uuid"], cleared["state"]) == (
        "ecc_dbe",
        active["gpu_uuid"],
        "cleared",
    )
    assert cleared["id"] != active["id"]


def test_each_rise_is_an_event_and_restarts_the_quiet_time(readings):
    clock = Clock()
    watcher = EccWatcher(quiet_s=100, clock=clock)
    poll_at(watcher, clock, 0, readings)

    [first] = poll_at(watcher, clock, 10, with_dbe(readings, 0, 1))
    [second] = poll_at(watcher, clock, 90, with_dbe(readings, 0, 3))
    assert poll_at(watcher, clock, 150, with_dbe(readings, 0, 3)) == []
    [cleared] = poll_at(watcher, clock, 190, with_dbe(readings, 0, 3))

    assert (first["detail"], second["detail"]) == ({"before": 0, "after": 1}, {"before": 1, "after": 3})
    assert cleared["state"] == "cleared"


def test_errors_counted_before_the_agent_started_are_not_new(readings):
    clock = Clock()
    watcher = EccWatcher(clock=clock)

    assert poll_at(watcher, clock, 0, with_dbe(readings, 0, 7)) == []
    assert poll_at(watcher, clock, 1, with_dbe(readings, 0, 7)) == []


def test_a_lower_count_after_a_driver_reload_is_a_new_baseline(readings):
    clock = Clock()
    watcher = EccWatcher(clock=clock)
    poll_at(watcher, clock, 0, with_dbe(readings, 0, 5))

    assert poll_at(watcher, clock, 1, with_dbe(readings, 0, 0)) == []
    [event] = poll_at(watcher, clock, 2, with_dbe(readings, 0, 1))
    assert event["detail"] == {"before": 0, "after": 1}


def test_a_gpu_without_ecc_is_skipped(readings):
    clock = Clock()
    watcher = EccWatcher(clock=clock)

    assert poll_at(watcher, clock, 0, with_dbe(readings, 0, None)) == []
    assert poll_at(watcher, clock, 1, with_dbe(readings, 0, None)) == []


def test_the_default_quiet_time_is_an_hour():
    assert ECC_QUIET_S == 3600
    assert EccWatcher().quiet_s == 3600
