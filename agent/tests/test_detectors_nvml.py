"""The detectors that read NVML in threads of their own (row remapping, the GPU
recovery action, Xid events), against the fake pynvml with the real H200's values, and a
lost GPU across the backend and all of them."""

import logging
import time

import pynvml
import pytest

from agent.backends.nvml import NvmlBackend
from agent.config import Config
from agent.detectors import close_watchers, make_watchers
from agent.detectors.recovery_action import RecoveryActionWatcher, recovery_action_names
from agent.detectors.row_remap import RowRemapWatcher
from agent.detectors.xid import XidWatcher
from agent.tests.fake_pynvml import FakeNvml

H200_UUID = "GPU-dd6ed4ff-be65-92a6-4ef1-1d9b77bae10b"


@pytest.fixture
def fake():
    return FakeNvml(gpu_count=4)


@pytest.fixture
def backend(fake):
    backend = NvmlBackend(nvml=fake)
    yield backend
    backend.close()


# Row remapping


def test_the_real_h200s_rows_raise_nothing(fake, backend):
    watcher = RowRemapWatcher(fake, backend.handles())

    assert watcher.check_once() == []
    assert fake.nvmlDeviceGetRemappedRows(backend.handles()[0][1]) == (0, 0, 0, 0)


def test_a_remapping_failure_is_critical_once(fake, backend):
    watcher = RowRemapWatcher(fake, backend.handles())
    watcher.check_once()

    fake.remapped_rows[2] = (0, 8, 0, 1)
    [event] = watcher.check_once()

    assert (event["signature"], event["severity"], event["gpu_uuid"]) == (
        "row_remap_failure",
        "critical",
        fake.uuid(2),
    )
    assert event["detail"] == {
        "correctable_rows": 0,
        "uncorrectable_rows": 8,
        "pending": False,
        "failure": True,
    }
    assert watcher.check_once() == []


def test_a_pending_remap_warns_and_clears_when_done(fake, backend):
    watcher = RowRemapWatcher(fake, backend.handles())

    fake.remapped_rows[1] = (0, 1, 1, 0)
    [pending] = watcher.check_once()
    assert watcher.check_once() == []
    fake.remapped_rows[1] = (0, 1, 0, 0)  # after the GPU reset
    [cleared] = watcher.check_once()

    assert (pending["signature"], pending["severity"], pending["state"]) == (
        "row_remap_pending",
        "warning",
        "active",
    )
    assert (cleared["signature"], cleared["gpu_uuid"], cleared["state"]) == (
        "row_remap_pending",
        fake.uuid(1),
        "cleared",
    )


def test_row_remapping_not_supported_is_not_read_again(fake, backend, caplog):
    caplog.set_level(logging.INFO)
    fake.not_supported.add("nvmlDeviceGetRemappedRows")
    watcher = RowRemapWatcher(fake, backend.handles())

    assert watcher.check_once() == []
    assert watcher.finished
    assert caplog.text.count("does not support row remapping") == 4


# The GPU recovery action


def test_recovery_action_names_come_from_pynvml():
    names = recovery_action_names(pynvml)

    assert names[pynvml.NVML_GPU_RECOVERY_ACTION_NONE] == "NONE"
    assert names[pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET] == "GPU_RESET"
    assert names[pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT] == "NODE_REBOOT"
    assert names[pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET] == "DRAIN_AND_RESET"


def test_the_real_h200s_recovery_action_none_raises_nothing(fake, backend):
    watcher = RecoveryActionWatcher(fake, backend.handles())

    assert watcher.check_once() == []
    assert watcher.check_once() == []


def test_an_action_opens_a_change_opens_again_and_none_clears(fake, backend):
    watcher = RecoveryActionWatcher(fake, backend.handles())
    watcher.check_once()

    fake.recovery_action[3] = pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
    [reset] = watcher.check_once()
    assert watcher.check_once() == []
    fake.recovery_action[3] = pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT
    [reboot] = watcher.check_once()
    fake.recovery_action[3] = pynvml.NVML_GPU_RECOVERY_ACTION_NONE
    [cleared] = watcher.check_once()

    assert (reset["signature"], reset["severity"], reset["gpu_uuid"], reset["state"]) == (
        "gpu_recovery_action",
        "critical",
        fake.uuid(3),
        "active",
    )
    assert reset["detail"] == {"action": 1, "action_name": "GPU_RESET"}
    assert reset["message"] == "the driver asks for GPU recovery action GPU_RESET"
    assert reboot["detail"] == {"action": 2, "action_name": "NODE_REBOOT"}
    assert (cleared["signature"], cleared["gpu_uuid"], cleared["state"]) == (
        "gpu_recovery_action",
        fake.uuid(3),
        "cleared",
    )


def test_an_action_already_set_at_start_opens(fake, backend):
    fake.recovery_action[0] = pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_P2P
    watcher = RecoveryActionWatcher(fake, backend.handles())

    [event] = watcher.check_once()

    assert event["detail"] == {"action": 3, "action_name": "DRAIN_P2P"}


def test_a_driver_without_the_field_is_not_read_again(fake, backend, caplog):
    caplog.set_level(logging.INFO)

    def field_values_of_an_older_driver(handle, field_ids):
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for value in values:
            value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values

    fake.nvmlDeviceGetFieldValues = field_values_of_an_older_driver
    watcher = RecoveryActionWatcher(fake, backend.handles())

    assert watcher.check_once() == []
    assert watcher.finished
    assert caplog.text.count("this driver gives no GPU recovery action") == 4


# A lost GPU


def test_a_lost_gpu_is_one_gpu_lost_and_the_others_keep_reporting(tmp_path, fake, backend):
    (tmp_path / "kmsg").write_text("")
    config = Config(node_name="gpu-001", kmsg_path=str(tmp_path / "kmsg"))
    watchers = make_watchers(config, backend)
    [xid] = [w for w in watchers if isinstance(w, XidWatcher)]
    [row_remap] = [w for w in watchers if isinstance(w, RowRemapWatcher)]
    [recovery] = [w for w in watchers if isinstance(w, RecoveryActionWatcher)]

    def collect():
        readings = backend.read_gpus()
        events = backend.take_events()
        for watcher in watchers:
            events.extend(watcher.poll(readings))
        return readings, events

    try:
        fake.lost.add(2)
        fake.fail_event_wait(pynvml.NVMLError_GpuIsLost())
        events = []
        for _ in range(3):
            readings, found = collect()
            events += found
            events += row_remap.check_once() + recovery.check_once()
            assert [gpu["uuid"] for gpu in readings] == [fake.uuid(i) for i in (0, 1, 3)]

        # The Xid thread outlived the lost GPU's error: the others' Xids still come.
        fake.raise_xid(3, 48)
        deadline = time.monotonic() + 5
        xids = []
        while not xids:
            assert time.monotonic() < deadline, "the Xid thread stopped"
            time.sleep(0.02)
            xids = collect()[1]
        fake.remapped_rows[1] = (0, 0, 1, 0)
        remap = row_remap.check_once()
    finally:
        close_watchers(watchers)

    assert [(e["signature"], e["gpu_uuid"]) for e in events] == [("gpu_lost", fake.uuid(2))]
    assert [(e["signature"], e["gpu_uuid"]) for e in xids] == [("xid:48", fake.uuid(3))]
    assert [(e["signature"], e["gpu_uuid"]) for e in remap] == [("row_remap_pending", fake.uuid(1))]
    assert [uuid for uuid, _ in row_remap._gpus] == [fake.uuid(i) for i in (0, 1, 3)]
    assert xid.sources[1]._thread is not None and not xid.sources[1]._thread.is_alive()
