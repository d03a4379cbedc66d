"""The simulated backend: real H200 readings, phase offsets, faults on a schedule."""

from agent.backends import GPU_FIELDS
from agent.backends.simulated import SimulatedBackend, simulated_gpu_uuid
from agent.inject import parse_inject
from agent.tests.fake_pynvml import load_trace


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def make(inject="", gpu_count=8, **options):
    clock = Clock()
    backend = SimulatedBackend(
        "gpu-001",
        gpu_count=gpu_count,
        faults=parse_inject(inject) if inject else (),
        clock=clock,
        **options,
    )
    return backend, clock


def at(backend, clock, seconds):
    clock.now = 1000.0 + seconds
    return backend.read_gpus(), backend.take_events()


def test_uuids_are_the_same_for_the_same_node_and_differ_between_nodes():
    first = SimulatedBackend("gpu-001").gpus()
    again = SimulatedBackend("gpu-001").gpus()
    other = SimulatedBackend("gpu-002").gpus()

    assert [gpu["uuid"] for gpu in first] == [gpu["uuid"] for gpu in again]
    assert len({gpu["uuid"] for gpu in first + other}) == 16
    assert first[3]["uuid"] == simulated_gpu_uuid("gpu-001", 3)


def test_every_reading_is_one_of_the_real_traces():
    trace = load_trace()["samples"]
    real = {
        (
            s["utilization"]["gpu"],
            s["temperature_c"],
            s["power_mw"] / 1000,
            s["sm_clock_mhz"],
            s["pcie_tx_kbps"] * 1024,
        )
        for s in trace
    }
    backend, clock = make()

    for second in range(0, 60, 3):
        gpus, _ = at(backend, clock, second)
        for gpu in gpus:
            assert set(gpu) == {"uuid", *GPU_FIELDS}
            assert (
                gpu["util_pct"],
                gpu["temp_c"],
                gpu["power_w"],
                gpu["sm_clock_mhz"],
                gpu["pcie_tx_bps"],
            ) in real


def test_gpus_are_offset_in_phase_through_idle_load_and_cooling():
    backend, clock = make()

    gpus, _ = at(backend, clock, 0)
    loaded = [gpu["util_pct"] >= 99 for gpu in gpus]

    assert any(loaded) and not all(loaded)  # some under load, some idle at one moment
    over_a_cycle = {at(backend, clock, second)[0][0]["util_pct"] >= 99 for second in range(28)}
    assert over_a_cycle == {True, False}  # each GPU goes through both


def test_an_xid_fires_once_at_its_time_on_its_gpu():
    backend, clock = make("xid:79@30s:gpu5")

    assert at(backend, clock, 29.9)[1] == []
    _, events = at(backend, clock, 30.0)
    assert at(backend, clock, 31)[1] == []

    [event] = events
    assert event["signature"] == "xid:79"
    assert event["severity"] == "critical"
    assert event["message"] == "GPU has fallen off the bus"
    assert event["gpu_uuid"] == simulated_gpu_uuid("gpu-001", 5)
    assert event["detail"] == {"xid": 79, "source": "simulated"}
    assert event["state"] == "active"


def test_an_xid_takes_its_description_from_nvidias_catalog():
    backend, clock = make("xid:48@0s,xid:9999@0s")

    _, events = at(backend, clock, 0)

    assert [event["message"] for event in events] == ["Double Bit ECC Error", "Xid 9999"]


def test_thermal_slowdown_sets_the_bit_warns_after_the_hold_and_clears_at_the_end():
    backend, clock = make("thermal@60s+30s:gpu2")

    gpus, events = at(backend, clock, 59)
    assert gpus[2]["clock_event_reasons"] & 0x40 == 0 and events == []

    gpus, events = at(backend, clock, 60)
    assert gpus[2]["clock_event_reasons"] & 0x40
    assert gpus[2]["temp_c"] >= 91  # above the H200's 89 C slowdown threshold
    assert all(gpu["clock_event_reasons"] & 0x40 == 0 for i, gpu in enumerate(gpus) if i != 2)
    assert events == []  # not held for 10 s yet

    _, events = at(backend, clock, 70)
    [warning] = events
    assert (warning["signature"], warning["severity"], warning["state"]) == (
        "thermal_throttle",
        "warning",
        "active",
    )
    assert warning["gpu_uuid"] == simulated_gpu_uuid("gpu-001", 2)

    assert at(backend, clock, 80)[1] == []
    gpus, events = at(backend, clock, 90)
    assert gpus[2]["clock_event_reasons"] & 0x40 == 0
    [cleared] = events
    assert (cleared["signature"], cleared["gpu_uuid"], cleared["state"]) == (
        "thermal_throttle",
        warning["gpu_uuid"],
        "cleared",
    )
    assert cleared["id"] != warning["id"]
    assert at(backend, clock, 200)[1] == []


def test_thermal_shorter_than_the_hold_raises_no_event():
    backend, clock = make("thermal@10s+5s")

    for second in range(0, 40):
        assert at(backend, clock, second)[1] == []


def test_thermal_without_a_duration_holds_until_the_agent_stops():
    backend, clock = make("thermal@0s", thermal_hold_s=2)

    _, events = at(backend, clock, 2)
    gpus, later = at(backend, clock, 10_000)

    assert [event["state"] for event in events] == ["active"]
    assert later == [] and gpus[0]["clock_event_reasons"] & 0x40


def test_a_lost_gpu_leaves_the_samples_and_the_hello():
    backend, clock = make("gpu_lost@5s:gpu1", gpu_count=4)

    assert len(at(backend, clock, 4)[0]) == 4
    gpus, events = at(backend, clock, 5)

    lost_uuid = simulated_gpu_uuid("gpu-001", 1)
    assert [(e["signature"], e["gpu_uuid"], e["severity"]) for e in events] == [
        ("gpu_lost", lost_uuid, "critical")
    ]
    assert lost_uuid not in [gpu["uuid"] for gpu in gpus]
    assert len(gpus) == 3
    assert [gpu["index"] for gpu in backend.gpus()] == [0, 2, 3]
    assert at(backend, clock, 6)[1] == []
