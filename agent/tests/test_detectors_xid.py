"""The Xid watcher: real kernel lines and NVML Xid events (from the fake pynvml's event
set) made into `xid:<code>` events, de-duplicated between the two sources and coalesced
in storms."""

import time

import pytest

from agent.backends.nvml import NvmlBackend
from agent.detectors.kernel_log import KmsgReader, parse_xid_line
from agent.detectors.nvml_xid import NvmlXidEvents
from agent.detectors.xid import XidSignal, XidWatcher
from agent.sim.kernel_log import SimulatedKernelLog
from agent.tests.fake_pynvml import FakeNvml

H200_UUID = "GPU-dd6ed4ff-be65-92a6-4ef1-1d9b77bae10b"
LINE_79 = (
    "NVRM: Xid (PCI:0000:00:06): 79, pid='<unknown>', name=<unknown>, "
    "GPU has fallen off the bus."
)
LINE_13 = (
    "NVRM: Xid (PCI:0000:00:07): 13, pid=4242, name=python3, Graphics SM Warp Exception "
    "on (GPC 0, TPC 0, SM 0): Out Of Range Address"
)


class Clock:
    def __init__(self):
        self.now = 500.0

    def __call__(self):
        return self.now


class Source:
    """Hands over the signals a test gives it, as a source thread would."""

    def __init__(self):
        self.waiting = []
        self.closed = False

    def take_signals(self):
        signals, self.waiting = self.waiting, []
        return signals

    def close(self):
        self.closed = True


@pytest.fixture
def fake():
    """The real H200 and a second GPU beside it (00000000:00:07.0)."""
    return FakeNvml(gpu_count=2)


@pytest.fixture
def backend(fake):
    backend = NvmlBackend(nvml=fake)
    yield backend
    backend.close()


def kmsg(line):
    return parse_xid_line(f"4,1,1,-;{line}", "kmsg")


def nvml(code, uuid):
    return XidSignal(source="nvml", code=code, gpu_uuid=uuid)


def poll_at(watcher, clock, seconds):
    clock.now = 500.0 + seconds
    return watcher.poll([])


def test_a_kernel_line_is_an_event_on_the_gpu_at_its_pci_address(backend):
    source, clock = Source(), Clock()
    watcher = XidWatcher(backend.gpus(), [source], clock=clock)

    source.waiting = [kmsg(LINE_79)]
    [event] = poll_at(watcher, clock, 0)

    assert event["signature"] == "xid:79"
    assert event["gpu_uuid"] == H200_UUID  # 0000:00:06 is NVML's 00000000:00:06.0
    assert event["severity"] == "critical"
    assert event["message"] == "GPU has fallen off the bus"  # NVIDIA's catalog
    assert event["count"] == 1
    assert event["state"] == "active"
    assert event["detail"] == {"xid": 79, "source": "kmsg", "kernel_line": LINE_79}


def test_the_same_xid_from_both_sources_is_one_signal_with_both_in_its_evidence(backend):
    kernel, events, clock = Source(), Source(), Clock()
    watcher = XidWatcher(backend.gpus(), [kernel, events], clock=clock)

    kernel.waiting = [kmsg(LINE_79)]
    events.waiting = [nvml(79, H200_UUID)]
    frames = poll_at(watcher, clock, 0)
    later = [poll_at(watcher, clock, s) for s in range(1, 30)]

    [event] = frames
    assert event["count"] == 1
    assert event["detail"] == {"xid": 79, "source": "kmsg+nvml", "kernel_line": LINE_79}
    assert later == [[]] * 29


def test_the_twin_arriving_a_poll_later_is_not_a_second_signal(backend):
    kernel, events, clock = Source(), Source(), Clock()
    watcher = XidWatcher(backend.gpus(), [kernel, events], clock=clock)

    events.waiting = [nvml(79, H200_UUID)]
    [event] = poll_at(watcher, clock, 0)
    kernel.waiting = [kmsg(LINE_79)]
    later = [poll_at(watcher, clock, s) for s in range(1, 30)]

    assert event["count"] == 1 and event["detail"]["source"] == "nvml"
    assert later == [[]] * 29


def test_different_codes_and_gpus_are_different_events(backend, fake):
    source, clock = Source(), Clock()
    watcher = XidWatcher(backend.gpus(), [source], clock=clock)

    source.waiting = [kmsg(LINE_79), kmsg(LINE_13), nvml(13, H200_UUID)]
    events = poll_at(watcher, clock, 0)

    assert sorted((e["signature"], e["gpu_uuid"], e["count"]) for e in events) == sorted(
        [("xid:13", H200_UUID, 1), ("xid:13", fake.uuid(1), 1), ("xid:79", H200_UUID, 1)]
    )


def test_repeats_are_coalesced_into_one_frame_per_window(backend):
    source, clock = Source(), Clock()
    watcher = XidWatcher(backend.gpus(), [source], window_s=10, clock=clock)

    source.waiting = [kmsg(LINE_13)]
    [first] = poll_at(watcher, clock, 0)
    frames = []
    for second in range(1, 10):
        source.waiting = [kmsg(LINE_13)] * 3
        frames.append(poll_at(watcher, clock, second))
    [repeats] = poll_at(watcher, clock, 10)

    assert first["count"] == 1
    assert frames == [[]] * 9
    assert repeats["count"] == 27
    assert repeats["signature"] == "xid:13" and repeats["id"] != first["id"]


def test_a_burst_ends_after_a_quiet_window_and_the_next_xid_goes_out_at_once(backend):
    source, clock = Source(), Clock()
    watcher = XidWatcher(backend.gpus(), [source], window_s=10, clock=clock)

    source.waiting = [kmsg(LINE_79)]
    poll_at(watcher, clock, 0)
    assert poll_at(watcher, clock, 10) == []  # quiet for a window: the burst ends
    source.waiting = [kmsg(LINE_79)]
    [again] = poll_at(watcher, clock, 11)

    assert again["count"] == 1


def test_a_storm_of_10000_lines_is_frames_whose_counts_sum_to_10000(backend):
    log, clock = SimulatedKernelLog(), Clock()
    watcher = XidWatcher(backend.gpus(), [log], clock=clock)

    for _ in range(10_000):
        log.write(LINE_13)
    frames = [event for second in range(60) for event in poll_at(watcher, clock, second)]

    assert len(frames) == 1
    assert sum(frame["count"] for frame in frames) == 10_000


def test_a_storm_seen_by_both_sources_over_half_a_minute_counts_10000_not_20000(backend, fake):
    kernel, events, clock = Source(), Source(), Clock()
    watcher = XidWatcher(backend.gpus(), [kernel, events], window_s=10, clock=clock)

    frames = []
    for second in range(30):  # 10,000 Xid 13 on GPU 1 over 30 s, seen by both
        share = 10_000 // 30 + (1 if second < 10_000 % 30 else 0)
        kernel.waiting = [kmsg(LINE_13)] * share
        events.waiting = [nvml(13, fake.uuid(1))] * share
        frames.extend(poll_at(watcher, clock, second))
    for second in range(30, 60):
        frames.extend(poll_at(watcher, clock, second))

    assert sum(frame["count"] for frame in frames) == 10_000
    assert len(frames) == 4  # the first at once, then one per 10 s window
    assert {frame["detail"]["source"] for frame in frames} == {"kmsg+nvml"}


def test_a_line_for_a_pci_address_of_no_gpu_here_keeps_the_address(backend):
    source, clock = Source(), Clock()
    watcher = XidWatcher(backend.gpus(), [source], clock=clock)

    line = "NVRM: Xid (PCI:0000:4e:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    source.waiting = [kmsg(line)]
    [event] = poll_at(watcher, clock, 0)

    assert event["gpu_uuid"] is None
    assert event["detail"]["pci_bus_id"] == "0000:4e:00"


def test_a_gpu_lost_after_start_still_maps(backend, fake):
    source, clock = Source(), Clock()
    watcher = XidWatcher(backend.gpus(), [source], clock=clock)
    fake.lost.add(0)
    backend.read_gpus()
    assert [gpu["index"] for gpu in backend.gpus()] == [1]

    source.waiting = [kmsg(LINE_79)]
    [event] = poll_at(watcher, clock, 0)

    assert event["gpu_uuid"] == H200_UUID


def test_xid_154_carries_the_drivers_recovery_action(backend):
    source, clock = Source(), Clock()
    watcher = XidWatcher(backend.gpus(), [source], clock=clock)
    line = (
        "NVRM: Xid (PCI:0000:00:06): 154, GPU recovery action changed from 0x0 (None) to "
        "0x2 (Node Reboot Required)"
    )

    source.waiting = [kmsg(line)]
    [event] = poll_at(watcher, clock, 0)

    assert event["message"] == "GPU Recovery Action Changed"
    assert event["detail"] == {
        "xid": 154,
        "source": "kmsg",
        "kernel_line": line,
        "recovery_action": 2,
        "recovery_action_text": "Node Reboot Required",
    }


def test_close_closes_the_sources(backend):
    sources = [Source(), Source()]
    XidWatcher(backend.gpus(), sources).close()

    assert [source.closed for source in sources] == [True, True]


# The NVML event set, in its thread


def take(source, count, timeout_s=5.0):
    signals = []
    deadline = time.monotonic() + timeout_s
    while len(signals) < count:
        assert time.monotonic() < deadline, f"only {len(signals)} of {count} signals came"
        signals.extend(source.take_signals())
        time.sleep(0.01)
    return signals


def test_nvml_xid_events_name_the_gpu_by_its_handle(backend, fake):
    events = NvmlXidEvents(fake, backend.handles())
    events.start()
    try:
        fake.raise_xid(1, 79)
        fake.raise_xid(0, 48)
        signals = take(events, 2)
    finally:
        events.close()

    assert signals == [nvml(79, fake.uuid(1)), nvml(48, H200_UUID)]
    [event_set] = fake.event_sets
    assert event_set.registered == {0: 0x8, 1: 0x8}  # nvmlEventTypeXidCriticalError
    assert event_set.freed


def test_nvml_xid_events_not_supported_is_one_log_line(backend, fake, caplog):
    fake.not_supported.add("nvmlDeviceRegisterEvents")

    events = NvmlXidEvents(fake, backend.handles())
    events.start()
    events.close()

    assert not events.available
    assert fake.event_sets[0].freed
    [record] = [r for r in caplog.records if r.name == "agent.detectors.nvml_xid"]
    assert record.getMessage() == (
        f"NVML does not deliver Xid events for {H200_UUID}, {fake.uuid(1)} (Not Supported): "
        "their Xids come from the kernel log only"
    )


def test_nvml_xid_events_stop_within_a_wait(backend, fake):
    events = NvmlXidEvents(fake, backend.handles())
    events.start()
    time.sleep(0.1)  # in nvmlEventSetWait_v2, which times out every 500 ms

    started = time.monotonic()
    events.close()

    assert time.monotonic() - started < 2.0  # a 0.5 s wait, with room for a busy machine
    assert not events._thread.is_alive()


def test_both_real_sources_through_one_watcher(tmp_path, backend, fake):
    kmsg_file = tmp_path / "kmsg"
    kmsg_file.write_text("")
    kernel = KmsgReader(str(kmsg_file))
    events = NvmlXidEvents(fake, backend.handles())
    clock = Clock()
    watcher = XidWatcher(backend.gpus(), [kernel, events], clock=clock)
    kernel.start()
    events.start()
    try:
        with open(kmsg_file, "a") as f:
            f.write(f"4,77,123456,-;{LINE_79}\n")
        fake.raise_xid(0, 79)
        deadline = time.monotonic() + 5
        # Both threads have handed their signal over before the poll.
        while not (kernel._signals.qsize() and events._signals.qsize()):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        [event] = poll_at(watcher, clock, 0)
    finally:
        watcher.close()

    assert event["gpu_uuid"] == H200_UUID
    assert event["count"] == 1
    assert event["detail"] == {"xid": 79, "source": "kmsg+nvml", "kernel_line": LINE_79}
    assert fake.event_sets[0].freed
