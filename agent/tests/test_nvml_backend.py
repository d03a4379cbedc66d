"""The NVML backend against a fake pynvml that serves a real H200's readings."""

import subprocess
import sys
import time
from pathlib import Path

import pynvml
import pytest

from agent.backends import GPU_FIELDS, BackendUnavailable, cuda_version_text
from agent.backends.nvml import NvmlBackend
from agent.tests.fake_pynvml import FakeNvml, trace_load_sample

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
        }
    ]


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
