"""The checks' decisions, from measurements and the server's params, with no GPU: the
real H200 figures (bf16 8192^3 at 788 TFLOP/s, a 4 GiB copy at 4.3 TB/s) as
measurements, against the baselines the server sends."""

from pathlib import Path

import pytest

from agent.checks import CHECKS, gpu_compute, gpu_memory_bandwidth, nccl, storage
from agent.checks.params import ParamError
from agent.checks.runner import prepare

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "nccl"

INVENTORY = [
    {
        "index": index,
        "uuid": f"GPU-dd6ed4ff-be65-92a6-4ef1-1d9b77bae1{index:02x}",
        "name": "NVIDIA H200",
        "pci_bus_id": f"00000000:00:{6 + index:02X}.0",
        "memory_total_bytes": 150754820096,
    }
    for index in range(8)
]


def compute_measurements(tflops_by_index):
    return {
        "backend": "torch",
        "size": 8192,
        "gpus": [
            {"index": gpu["index"], "uuid": gpu["uuid"], "name": gpu["name"], "tflops": tflops}
            for gpu, tflops in zip(INVENTORY, tflops_by_index)
        ],
    }


def compute_params(**given):
    return gpu_compute.read_params(given)


def test_h200_at_788_tflops_passes_a_711_baseline():
    result = gpu_compute.decide(
        compute_measurements([788.0, 791.2, 785.4, 788.9, 790.0, 787.1, 786.5, 789.3]),
        compute_params(min_tflops=711),
        INVENTORY,
    )

    assert result["status"] == "passed"
    assert result["metrics"]["tflops"] == 785.4
    assert result["metrics"]["gpus"][INVENTORY[2]["uuid"]] == {"index": 2, "tflops": 785.4}
    assert result["metrics"]["backend"] == "torch"
    assert result["metrics"]["size"] == 8192
    assert result["message"] == (
        f"8 GPUs at or above 711 TFLOP/s; lowest 785.4 on GPU 2 ({INVENTORY[2]['uuid']})"
    )


def test_a_gpu_at_540_tflops_fails_and_the_message_names_it():
    tflops = [788.0] * 8
    tflops[3] = 540.0

    result = gpu_compute.decide(
        compute_measurements(tflops), compute_params(min_tflops=711), INVENTORY
    )

    assert result["status"] == "failed"
    assert result["metrics"]["tflops"] == 540.0
    assert result["message"] == (
        f"GPU 3 ({INVENTORY[3]['uuid']}): 540 TFLOP/s, below the minimum 711"
    )


def test_every_slow_gpu_is_listed():
    tflops = [788.0] * 8
    tflops[1], tflops[6] = 600.5, 433.0

    result = gpu_compute.decide(
        compute_measurements(tflops), compute_params(min_tflops=711), INVENTORY
    )

    assert result["message"].split("; ") == [
        f"GPU 1 ({INVENTORY[1]['uuid']}): 600.5 TFLOP/s, below the minimum 711",
        f"GPU 6 ({INVENTORY[6]['uuid']}): 433 TFLOP/s, below the minimum 711",
    ]


def test_without_a_baseline_it_passes_as_measured():
    result = gpu_compute.decide(compute_measurements([788.0] * 8), compute_params(), INVENTORY)

    assert result["status"] == "passed"
    assert result["message"] == "measured; no baseline given"
    assert result["metrics"]["tflops"] == 788.0


def test_a_gpu_the_library_does_not_see_fails_even_without_a_baseline():
    measurements = compute_measurements([788.0] * 7)  # GPU 7 is not there

    result = gpu_compute.decide(measurements, compute_params(), INVENTORY)

    assert result["status"] == "failed"
    assert result["message"] == (
        f"GPU 7 ({INVENTORY[7]['uuid']}): not measured, torch does not see it"
    )


def test_a_gpu_whose_product_failed_fails_the_check():
    measurements = compute_measurements([788.0] * 8)
    measurements["gpus"][4] = {
        **measurements["gpus"][4],
        "error": "AcceleratorError: CUDA error: an illegal memory access was encountered",
    }
    del measurements["gpus"][4]["tflops"]

    result = gpu_compute.decide(measurements, compute_params(min_tflops=711), INVENTORY)

    assert result["status"] == "failed"
    assert result["message"] == (
        f"GPU 4 ({INVENTORY[4]['uuid']}): the matrix product failed: AcceleratorError: CUDA "
        "error: an illegal memory access was encountered"
    )
    assert result["metrics"]["tflops"] == 788.0
    assert "error" in result["metrics"]["gpus"][INVENTORY[4]["uuid"]]


def test_cupy_measurements_get_nvmls_uuids_through_the_pci_bus_id():
    measurements = {
        "backend": "cupy",
        "size": 8192,
        "gpus": [
            {"index": 0, "uuid": None, "pci_bus_id": "0000:00:06.0", "tflops": 781.0},
            {"index": 1, "uuid": None, "pci_bus_id": "0000:00:07.0", "tflops": 779.5},
        ],
    }

    result = gpu_compute.decide(measurements, compute_params(min_tflops=711), INVENTORY[:2])

    assert result["status"] == "passed"
    assert set(result["metrics"]["gpus"]) == {INVENTORY[0]["uuid"], INVENTORY[1]["uuid"]}


def test_no_cuda_device_at_all_is_an_error():
    result = gpu_compute.decide(
        {"backend": "torch", "size": 8192, "gpus": []}, compute_params(), INVENTORY
    )

    assert result["status"] == "error"
    assert result["message"] == "torch sees no CUDA device to measure"


def test_h200_copy_at_4_3_tbps_passes_and_a_slow_one_fails():
    def measurements(tbps_by_index):
        return {
            "backend": "torch",
            "bytes": 4 * 2**30,
            "gpus": [
                {"index": gpu["index"], "uuid": gpu["uuid"], "name": gpu["name"], "tbps": tbps}
                for gpu, tbps in zip(INVENTORY, tbps_by_index)
            ],
        }

    params = gpu_memory_bandwidth.read_params({"min_tbps": 3.9})
    healthy = gpu_memory_bandwidth.decide(measurements([4.3] * 8), params, INVENTORY)
    slow = gpu_memory_bandwidth.decide(measurements([4.3] * 7 + [2.9]), params, INVENTORY)

    assert healthy["status"] == "passed"
    assert healthy["metrics"]["tbps"] == 4.3
    assert healthy["metrics"]["bytes"] == 4 * 2**30
    assert slow["status"] == "failed"
    assert slow["message"] == f"GPU 7 ({INVENTORY[7]['uuid']}): 2.9 TB/s, below the minimum 3.9"


def test_the_copy_buffer_is_4_gib_a_quarter_of_free_memory_or_what_was_asked():
    GiB = 2**30

    assert gpu_memory_bandwidth.buffer_bytes(None, 139 * GiB) == 4 * GiB
    assert gpu_memory_bandwidth.buffer_bytes(None, 6 * GiB) == int(1.5 * GiB)
    assert gpu_memory_bandwidth.buffer_bytes(8 * GiB, 139 * GiB) == 8 * GiB
    with pytest.raises(Exception, match="bytes=8589934592 needs two buffers"):
        gpu_memory_bandwidth.buffer_bytes(8 * GiB, 10 * GiB)


def test_time_limits_follow_the_params():
    default = gpu_compute.time_limit_s(compute_params(), 8)
    longer = gpu_compute.time_limit_s(compute_params(seconds=60), 8)
    one_gpu = gpu_compute.time_limit_s(compute_params(seconds=60), 1)

    assert longer > default
    # each GPU is measured in turn: the limit grows by one GPU's share per GPU
    assert longer - one_gpu == pytest.approx(7 * (one_gpu - gpu_compute.STARTUP_S))
    assert one_gpu > 60
    assert storage.time_limit_s(storage.read_params({"bytes": 2**30}), 0) < storage.time_limit_s(
        storage.read_params({"bytes": 8 * 2**30}), 0
    )


# Params


@pytest.mark.parametrize(
    "check, params, message",
    [
        ("gpu_compute", {"min_tflops": "711"}, "min_tflops: expected a number, got '711'"),
        ("gpu_compute", {"min_tflops": True}, "min_tflops: expected a number, got True"),
        ("gpu_compute", {"size": 8192.0}, "size: expected an integer, got 8192.0"),
        ("gpu_compute", {"size": 16}, "size: 16 is below the least allowed, 256"),
        ("gpu_compute", {"min_tflop": 711}, "min_tflop: not a param of this check"),
        ("gpu_compute", {"seconds": 5, "iterations": 10}, "iterations, seconds: give one"),
        ("gpu_compute", {"backend": "jax"}, "backend: 'jax' is not one of torch, cupy"),
        ("gpu_memory_bandwidth", {"bytes": 1024}, "bytes: 1024 is below the least allowed"),
        ("nvml_sanity", {"expected_gpus": "8"}, "expected_gpus: expected an integer"),
        ("storage", {"path": ""}, "path: expected a non-empty string"),
        ("nccl", {"min_busbw_gbps": float("nan")}, "min_busbw_gbps: expected a finite number"),
    ],
)
def test_bad_params_are_refused_naming_the_param(check, params, message):
    with pytest.raises(Exception) as caught:
        prepare(CHECKS, check, params)

    assert str(caught.value).startswith(f"bad params for {check}: ")
    assert message in str(caught.value)


def test_params_must_be_an_object_and_null_means_not_given():
    with pytest.raises(ParamError, match=r"params: expected a JSON object, got \[1\]"):
        gpu_compute.read_params([1])

    assert gpu_compute.read_params({"min_tflops": None, "size": None}) == {
        "size": 8192,
        "iterations": 10,
        "seconds": None,
        "min_tflops": None,
        "backend": None,
    }


def test_an_unknown_check_names_the_checks_this_agent_runs():
    with pytest.raises(Exception) as caught:
        prepare(CHECKS, "x", {})

    assert str(caught.value) == (
        "unknown check 'x'; this agent runs: gpu_compute, gpu_memory_bandwidth, nccl, "
        "nvml_sanity, storage"
    )


# storage


def test_storage_compares_both_directions_with_their_minimums():
    measurements = {
        "path": "/scratch",
        "bytes": 2**30,
        "write_mbps": 850.0,
        "read_mbps": 2400.0,
        "page_cache_dropped": True,
    }

    good = storage.decide(
        measurements, storage.read_params({"min_write_mbps": 500, "min_read_mbps": 1000}), []
    )
    slow = storage.decide(
        measurements, storage.read_params({"min_write_mbps": 1000, "min_read_mbps": 3000}), []
    )

    assert good["status"] == "passed"
    assert good["message"] == "write 850 MB/s, read 2400 MB/s on /scratch: at or above the minimums"
    assert good["metrics"] == measurements
    assert slow["status"] == "failed"
    assert slow["message"] == (
        "write 850 MB/s on /scratch, below the minimum 1000; "
        "read 2400 MB/s on /scratch, below the minimum 3000"
    )


# nccl


def test_all_reduce_perf_output_is_read_from_a_real_8_gpu_sweep():
    text = (FIXTURES / "all_reduce_perf_8xA100_sweep.txt").read_text()

    figures = nccl.parse_all_reduce_perf(text)

    assert figures == {
        "avg_busbw_gbps": 66.2058,
        "max_busbw_gbps": 232.44,
        "largest_bytes": 4294967296,
        "sizes": 30,
        "wrong_rows": 0,
        "out_of_bounds": 0,
    }


def test_lines_mixed_into_the_table_are_skipped():
    text = (FIXTURES / "all_reduce_perf_8xA100_mpirun_interleaved.txt").read_text()

    figures = nccl.parse_all_reduce_perf(text)

    assert figures["avg_busbw_gbps"] == 72.7724
    assert figures["sizes"] == 30
    assert figures["max_busbw_gbps"] == 232.93


def test_the_2025_format_with_collective_test_lines_is_read():
    text = (FIXTURES / "all_reduce_perf_8xA100_10G.txt").read_text()

    figures = nccl.parse_all_reduce_perf(text)

    assert figures["avg_busbw_gbps"] == 232.167
    assert figures["sizes"] == 1
    assert figures["largest_bytes"] == 10737418240


def test_output_without_the_summary_is_not_read():
    text = (FIXTURES / "all_reduce_perf_8xA100_sweep.txt").read_text()
    cut = text[: text.index("# Out of bounds")]

    assert nccl.parse_all_reduce_perf(cut) is None


def test_nccl_fails_below_its_minimum_and_on_wrong_results():
    text = (FIXTURES / "all_reduce_perf_8xA100_sweep.txt").read_text()
    figures = {**nccl.parse_all_reduce_perf(text), "gpus": 8}
    corrupt_text = text.replace(
        "   268435456      67108864     float     sum      -1   2392.6  112.19  196.34      0",
        "   268435456      67108864     float     sum      -1   2392.6  112.19  196.34      3",
    ).replace("# Out of bounds values : 0 OK", "# Out of bounds values : 3 FAILED")
    corrupt = {**nccl.parse_all_reduce_perf(corrupt_text), "gpus": 8}

    passes = nccl.decide(figures, nccl.read_params({"min_busbw_gbps": 60}), INVENTORY)
    slow = nccl.decide(figures, nccl.read_params({"min_busbw_gbps": 80}), INVENTORY)
    wrong = nccl.decide(corrupt, nccl.read_params({}), INVENTORY)

    assert passes["status"] == "passed"
    assert passes["message"] == (
        "average bus bandwidth 66.2058 GB/s across 8 GPUs: at or above the minimum 60"
    )
    assert slow["status"] == "failed"
    assert slow["message"] == "average bus bandwidth 66.2058 GB/s, below the minimum 80"
    assert wrong["status"] == "failed"
    assert wrong["message"] == (
        "all_reduce_perf found 3 values out of bounds (wrong results); "
        "all_reduce_perf found wrong results at 1 sizes"
    )
