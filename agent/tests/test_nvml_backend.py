"""The NVML backend against a fake pynvml that serves a real H200's readings."""

import subprocess
import sys
import time
from pathlib import Path

import pynvml
import pytest

from agent.backends import ACTIVITY_FIELDS, GPU_FIELDS, BackendUnavailable, cuda_version_text
from agent.backends.nvml import NvmlBackend
from agent.tests.fake_pynvml import FakeNvml, load_gpm, trace_load_sample

REPO = Path(__file__).resolve().parents[2]
H200_UUID = "GPU-dd6ed4ff-be65-92a6-4ef1-1d9b77bae10b"


@pytest.fixture
def open_backend():
    """open_backend(fake, **options): an NvmlBackend closed after the test."""
    backends = []

    def make(fake, **options):
        backend = NvmlBackend(nvml=fake, **options)
        backends.append(backend)
        return backend

    yield make
    for backend in backends:
        backend.close()


def test_hello_facts_are_the_real_h200s(open_backend):
    backend = open_backend(FakeNvml())

    assert backend.driver_version == "580.159.04"
    assert backend.cuda_version == "13.0"
    assert backend.gpus() == [
        {
            "index": 0,
            "uuid": H200_UUID,
            "name": "NVIDIA H200",
            "serial": "1654124008485",  # nvidia-smi -q on that H200: "Serial Number"
            "pci_bus_id": "00000000:00:06.0",
            "memory_total_bytes": 150754820096,
        }
    ]


def test_a_gpu_without_a_readable_serial_says_none(open_backend):
    backend = open_backend(FakeNvml(not_supported={"nvmlDeviceGetSerial"}))
    assert backend.gpus()[0]["serial"] is None


def test_idle_sample_is_the_snapshots_dynamic_block(open_backend):
    backend = open_backend(FakeNvml())
    backend.wait_ready(timeout_s=5)

    assert backend.read_gpus() == [
        {
            "uuid": H200_UUID,
            "util_pct": 0,
            "mem_util_pct": 0,
            "mem_used_bytes": 644939776,
            "temp_c": 31,
            "power_w": 116.936,
            "sm_clock_mhz": 495,
            "clock_event_reasons": 1,
            "ecc_dbe_volatile": 0,
            "pcie_tx_bps": 1411 * 1024,
            "pcie_rx_bps": 627 * 1024,
            # GPM compares two samples: the first has nothing to compare with yet
            **dict.fromkeys(ACTIVITY_FIELDS),
        }
    ]


def test_load_sample_is_the_traces(open_backend):
    load = trace_load_sample()  # t = 15.121 s, in the bf16 matmul load
    backend = open_backend(FakeNvml(dynamic=load))
    backend.wait_ready(timeout_s=5)

    assert backend.read_gpus() == [
        {
            "uuid": H200_UUID,
            "util_pct": 99,
            "mem_util_pct": 25,
            "mem_used_bytes": 1704853504,
            "temp_c": 55,
            "power_w": 688.595,
            "sm_clock_mhz": 1455,
            "clock_event_reasons": 4,  # SW power cap, at the 700 W limit
            "ecc_dbe_volatile": 0,
            "pcie_tx_bps": 7067 * 1024,
            "pcie_rx_bps": 15994 * 1024,
            **dict.fromkeys(ACTIVITY_FIELDS),
        }
    ]


# GPM (never captured on hardware: agent/data/h200/gpm_metrics.json says so) ------------------

ACTIVITY_METRIC_NAMES = {
    "gr_engine_active_pct": "NVML_GPM_METRIC_GRAPHICS_UTIL",
    "sm_active_pct": "NVML_GPM_METRIC_SM_UTIL",
    "sm_occupancy_pct": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "tensor_active_pct": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "dram_active_pct": "NVML_GPM_METRIC_DRAM_BW_UTIL",
}


def activity(block):
    return {field: round(load_gpm()[block][metric], 1)
            for field, metric in ACTIVITY_METRIC_NAMES.items()}


def test_gpu_activity_at_load_comes_from_gpm_from_the_second_sample(open_backend):
    fake = FakeNvml(dynamic={**trace_load_sample(), "utilization": {"gpu": 100, "memory": 25}})
    backend = open_backend(fake)

    first, second = backend.read_gpus()[0], backend.read_gpus()[0]

    assert {field: first[field] for field in ACTIVITY_FIELDS} == dict.fromkeys(ACTIVITY_FIELDS)
    assert {field: second[field] for field in ACTIVITY_FIELDS} == activity("at_load")


def test_gpu_activity_follows_the_load_between_two_samples(open_backend):
    fake = FakeNvml(dynamic={**trace_load_sample(), "utilization": {"gpu": 100, "memory": 25}})
    backend = open_backend(fake)
    backend.read_gpus()
    fake.dynamic = fake.device["dynamic"]  # idle from now on
    backend.read_gpus()  # half the interval at load, as NVML averages over it

    [gpu] = backend.read_gpus()

    assert gpu["sm_active_pct"] == 0.0 and gpu["tensor_active_pct"] == 0.0


def test_a_gpu_before_hopper_has_null_activity(open_backend):
    fake = FakeNvml()
    fake.architecture = pynvml.NVML_DEVICE_ARCH_AMPERE
    backend = open_backend(fake)

    readings = [backend.read_gpus()[0] for _ in range(3)]

    assert all(gpu[field] is None for gpu in readings for field in ACTIVITY_FIELDS)
    assert readings[-1]["util_pct"] == 0  # the rest still reports
    assert fake.gpm_samples == {}  # nothing allocated for a GPU without GPM


def test_a_failing_gpm_read_is_null_and_the_rest_still_reports(open_backend):
    fake = FakeNvml(not_supported={"nvmlGpmSampleGet"})
    backend = open_backend(fake)

    readings = [backend.read_gpus()[0] for _ in range(2)]

    assert all(gpu[field] is None for gpu in readings for field in ACTIVITY_FIELDS)
    assert readings[-1]["temp_c"] == 31


def test_closing_frees_the_gpm_samples(open_backend):
    fake = FakeNvml(gpu_count=2)
    backend = NvmlBackend(nvml=fake)
    backend.read_gpus()
    assert len(fake.gpm_samples) == 4  # two per GPU: the last one and the next

    backend.close()

    assert fake.gpm_samples == {}


def test_a_sample_of_8_gpus_never_waits_on_pcie_throughput(open_backend):
    fake = FakeNvml(gpu_count=8, pcie_delay_s=0.021)  # as slow as a real H200
    backend = open_backend(fake, pcie_interval_s=0.05)

    durations = []
    for _ in range(5):
        started = time.perf_counter()
        gpus = backend.read_gpus()
        durations.append(time.perf_counter() - started)
        assert len(gpus) == 8

    # Waiting on PCIe would cost 8 GPUs x 2 counters x 21 ms = 336 ms per sample.
    # Waiting on PCIe would cost 8 x 21 ms; 0.1 s leaves room for a busy machine.
    assert max(durations) < 0.1
    backend.wait_ready(timeout_s=5)
    assert fake.pcie_calls >= 16
    assert {gpu["pcie_tx_bps"] for gpu in backend.read_gpus()} == {1411 * 1024}


def test_pcie_is_null_until_first_read(open_backend):
    backend = open_backend(FakeNvml(pcie_delay_s=0.2))

    [gpu] = backend.read_gpus()

    assert gpu["pcie_tx_bps"] is None and gpu["pcie_rx_bps"] is None


def test_unsupported_fields_are_null(open_backend):
    fake = FakeNvml(
        not_supported={
            "nvmlDeviceGetPowerUsage",
            "nvmlDeviceGetTotalEccErrors",
            "nvmlDeviceGetUtilizationRates",
            "nvmlDeviceGetPcieThroughput",
        }
    )
    backend = open_backend(fake)
    backend.wait_ready(timeout_s=5)
    backend.read_gpus()  # GPM's first sample

    [gpu] = backend.read_gpus()

    nulls = {
        "power_w",
        "ecc_dbe_volatile",
        "util_pct",
        "mem_util_pct",
        "pcie_tx_bps",
        "pcie_rx_bps",
    }
    assert set(gpu) == {"uuid", *GPU_FIELDS}
    assert {name for name, value in gpu.items() if value is None} == nulls
    assert gpu["temp_c"] == 31


def test_a_failing_field_is_null_and_the_rest_still_reports(open_backend):
    def broken_temperature(handle, sensor):
        raise pynvml.NVMLError_Unknown()

    fake = FakeNvml()
    fake.nvmlDeviceGetTemperature = broken_temperature
    backend = open_backend(fake)

    [gpu] = backend.read_gpus()

    assert gpu["temp_c"] is None
    assert gpu["power_w"] == 116.936


def test_a_lost_gpu_is_reported_once_and_the_others_keep_reporting(open_backend):
    fake = FakeNvml(gpu_count=4)
    backend = open_backend(fake)
    assert len(backend.read_gpus()) == 4
    assert backend.take_events() == []

    fake.lost.add(2)
    first = backend.read_gpus()
    events = backend.take_events()
    second = backend.read_gpus()

    assert [gpu["uuid"] for gpu in first] == [fake.uuid(0), fake.uuid(1), fake.uuid(3)]
    assert [gpu["uuid"] for gpu in second] == [fake.uuid(0), fake.uuid(1), fake.uuid(3)]
    assert [(e["type"], e["signature"], e["gpu_uuid"], e["severity"]) for e in events] == [
        ("event", "gpu_lost", fake.uuid(2), "critical")
    ]
    assert backend.take_events() == []
    assert [gpu["index"] for gpu in backend.gpus()] == [0, 1, 3]


def test_a_gpu_lost_before_start_is_left_out(open_backend):
    fake = FakeNvml(gpu_count=3)
    fake.lost.add(1)

    backend = open_backend(fake)

    assert [gpu["index"] for gpu in backend.gpus()] == [0, 2]


@pytest.mark.parametrize(
    "error, words",
    [
        (pynvml.NVMLError_LibraryNotFound, "driver is not installed"),
        (pynvml.NVMLError_DriverNotLoaded, "driver is not loaded"),
        (pynvml.NVMLError_NoPermission, "NVML failed to start"),
    ],
)
def test_no_driver_is_a_clear_error(error, words):
    with pytest.raises(BackendUnavailable, match=words):
        NvmlBackend(nvml=FakeNvml(init_error=error))


def test_print_once_without_a_driver_exits_2_with_one_clear_line(tmp_path):
    # No NVIDIA driver on this machine: the real pynvml cannot find libnvidia-ml.
    result = subprocess.run(
        [sys.executable, "-m", "agent", "--print-once", "--state-dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )

    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "clusterui-agent: the NVIDIA driver is not installed here: NVML (libnvidia-ml.so.1) "
        "was not found. Install the driver, or run with --simulate."
    ]


@pytest.mark.parametrize(
    "value, text", [(13000, "13.0"), (12040, "12.4"), (12080, "12.8"), (11020, "11.2")]
)
def test_cuda_version_text(value, text):
    assert cuda_version_text(value) == text
