"""The simulated backend: real H200 readings, phase offsets, and faults on a schedule
that the same detectors as on a real node find (the pipeline the client runs: read the
GPUs, take the backend's events, poll each watcher with the readings)."""

from agent.backends import GPU_FIELDS
from agent.config import parse_inject
from agent.detectors.ecc import EccWatcher
from agent.detectors.throttle import ThrottleWatcher
from agent.detectors.xid import XidWatcher
from agent.sim.backend import SimulatedBackend, kernel_pci_address, simulated_gpu_uuid
from agent.tests.fake_pynvml import load_trace


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class Node:
    """A simulated node and the watchers make_watchers gives it, on one test clock."""

    def __init__(self, inject="", gpu_count=8, throttle_hold_s=10.0):
        self.clock = Clock()
        self.backend = SimulatedBackend(
            "gpu-001",
            gpu_count=gpu_count,
            faults=parse_inject(inject) if inject else (),
            clock=self.clock,
        )
        self.watchers = [
            ThrottleWatcher(hold_s=throttle_hold_s, clock=self.clock),
            EccWatcher(clock=self.clock),
            XidWatcher(self.backend.gpus(), [self.backend.kernel_log], clock=self.clock),
        ]

    def at(self, seconds):
        """The readings and the events of the sample at `seconds` after the start."""
        self.clock.now = 1000.0 + seconds
        readings = self.backend.read_gpus()
        events = self.backend.take_events()
        for watcher in self.watchers:
            events.extend(watcher.poll(readings))
        return readings, events


def make(inject="", gpu_count=8):
    clock = Clock()
    backend = SimulatedBackend(
        "gpu-001",
        gpu_count=gpu_count,
        faults=parse_inject(inject) if inject else (),
        clock=clock,
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


def test_an_xid_is_a_real_format_kernel_line_made_an_event_by_the_xid_watcher():
    node = Node("xid:79@30s:gpu5")

    assert node.at(29.9)[1] == []
    _, events = node.at(30.0)
    assert node.at(31)[1] == []

    [event] = events
    line = (
        "NVRM: Xid (PCI:0000:00:0b): 79, pid='<unknown>', name=<unknown>, "
        "GPU has fallen off the bus."
    )
    assert event["signature"] == "xid:79"
    assert event["severity"] == "critical"
    assert event["message"] == "GPU has fallen off the bus"
    assert event["gpu_uuid"] == simulated_gpu_uuid("gpu-001", 5)
    assert event["count"] == 1
    assert event["detail"] == {"xid": 79, "source": "simulated_kmsg", "kernel_line": line}
    assert event["state"] == "active"


def test_the_kernel_line_names_the_gpus_pci_address():
    backend, _ = make()

    assert backend.gpus()[5]["pci_bus_id"] == "00000000:00:0B.0"
    assert kernel_pci_address("00000000:00:0B.0") == "0000:00:0b"
    assert kernel_pci_address("00000000:00:06.0") == "0000:00:06"


def test_an_xid_takes_its_description_from_nvidias_catalog():
    node = Node("xid:48@0s,xid:9999@0s")

    _, events = node.at(0)

    assert sorted(event["message"] for event in events) == ["Double Bit ECC Error", "Xid 9999"]


def test_xid_154_is_the_drivers_recovery_action_line():
    node = Node("xid:154@0s:gpu2")

    [event] = node.at(0)[1]

    assert event["detail"]["kernel_line"] == (
        "NVRM: Xid (PCI:0000:00:08): 154, GPU recovery action changed from 0x0 (None) to "
        "0x2 (Node Reboot Required)"
    )
    assert event["detail"]["recovery_action"] == 2


def test_an_xid_storm_is_10000_lines_and_events_whose_counts_sum_to_10000():
    node = Node("xid_storm:13@5s:gpu1")

    events = [event for second in range(60) for event in node.at(second)[1]]

    assert [(e["signature"], e["gpu_uuid"]) for e in events] == [
        ("xid:13", simulated_gpu_uuid("gpu-001", 1))
    ]
    assert sum(event["count"] for event in events) == 10_000


def test_thermal_slowdown_sets_the_bit_and_the_throttle_watcher_holds_and_clears_it():
    node = Node("thermal@60s+30s:gpu2")

    gpus, events = node.at(59)
    assert gpus[2]["clock_event_reasons"] & 0x40 == 0 and events == []

    gpus, events = node.at(60)
    assert gpus[2]["clock_event_reasons"] & 0x40
    assert gpus[2]["temp_c"] >= 91  # above the H200's 89 C slowdown threshold
    assert all(gpu["clock_event_reasons"] & 0x40 == 0 for i, gpu in enumerate(gpus) if i != 2)
    assert events == []  # not held for 10 s yet

    for second in range(61, 70):
        assert node.at(second)[1] == []
    _, events = node.at(70)
    [warning] = events
    assert (warning["signature"], warning["severity"], warning["state"]) == (
        "thermal_throttle",
        "warning",
        "active",
    )
    assert warning["gpu_uuid"] == simulated_gpu_uuid("gpu-001", 2)
    assert warning["detail"]["clock_event_reasons"] & 0x40

    for second in range(71, 90):
        assert node.at(second)[1] == []
    gpus, events = node.at(90)
    assert gpus[2]["clock_event_reasons"] & 0x40 == 0
    [cleared] = events
    assert (cleared["signature"], cleared["gpu_uuid"], cleared["state"]) == (
        "thermal_throttle",
        warning["gpu_uuid"],
        "cleared",
    )
    assert cleared["id"] != warning["id"]
    assert [node.at(second)[1] for second in range(91, 200, 7)] == [[]] * 16


def test_thermal_shorter_than_the_hold_raises_no_event():
    node = Node("thermal@10s+5s")

    for second in range(0, 40):
        assert node.at(second)[1] == []


def test_thermal_without_a_duration_holds_until_the_agent_stops():
    node = Node("thermal@0s", throttle_hold_s=2)

    node.at(0)
    node.at(1)
    _, events = node.at(2)
    gpus, later = node.at(10_000)

    assert [event["state"] for event in events] == ["active"]
    assert later == [] and gpus[0]["clock_event_reasons"] & 0x40


def test_an_ecc_fault_raises_the_count_and_the_ecc_watcher_sees_it():
    node = Node("ecc_dbe@20s:gpu4")

    before, events = node.at(19)
    assert before[4]["ecc_dbe_volatile"] == 0 and events == []
    after, events = node.at(20)
    assert node.at(21)[1] == []

    assert after[4]["ecc_dbe_volatile"] == 1
    [event] = events
    assert (event["signature"], event["severity"], event["gpu_uuid"]) == (
        "ecc_dbe",
        "critical",
        simulated_gpu_uuid("gpu-001", 4),
    )
    assert event["detail"] == {"before": 0, "after": 1}


def test_the_demos_faults_come_out_on_time():
    # The demo fleet's inject file for a node: xid:79@90s:gpu3 and thermal@45s+60s:gpu5.
    node = Node("xid:79@90s:gpu3,thermal@45s+60s:gpu5")

    found = {}
    for second in range(0, 130):
        for event in node.at(second)[1]:
            found[(event["signature"], event["state"])] = second

    assert found == {
        ("thermal_throttle", "active"): 55,
        ("xid:79", "active"): 90,
        ("thermal_throttle", "cleared"): 105,
    }


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
