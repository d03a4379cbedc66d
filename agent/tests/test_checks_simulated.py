"""SimulatedCheckRunner: a --simulate node answers every check like a healthy H200
node, and its injected faults fail the checks for the right reason."""

import asyncio

import pytest

from agent.config import parse_inject
from agent.sim.backend import SimulatedBackend
from agent.sim.checks import SimulatedCheckRunner


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def make(inject="", gpu_count=8):
    clock = Clock()
    backend = SimulatedBackend(
        "gpu-001", gpu_count=gpu_count, faults=parse_inject(inject) if inject else (), clock=clock
    )
    return SimulatedCheckRunner(backend, "/scratch", duration_s=0), backend, clock


def run(runner, check, params):
    return asyncio.run(runner.run(check, params))


def test_a_healthy_node_passes_the_h200_baselines():
    runner, backend, _ = make()

    compute = run(runner, "gpu_compute", {"min_tflops": 711})
    bandwidth = run(runner, "gpu_memory_bandwidth", {"min_tbps": 3.9})
    sanity = run(runner, "nvml_sanity", {"expected_gpus": 8, "pcie_gen": 5, "pcie_width": 16})
    scratch = run(runner, "storage", {"min_write_mbps": 500, "min_read_mbps": 500})

    for result in (compute, bandwidth, sanity, scratch):
        assert result["status"] == "passed", result
        assert result["metrics"]["simulated"] is True
    uuids = [gpu["uuid"] for gpu in backend.gpus()]
    assert set(compute["metrics"]["gpus"]) == set(uuids)
    for gpu in compute["metrics"]["gpus"].values():
        assert 788 * 0.98 <= gpu["tflops"] <= 788 * 1.02
    for gpu in bandwidth["metrics"]["gpus"].values():
        assert 4.3 * 0.98 <= gpu["tbps"] <= 4.3 * 1.02
    assert sanity["metrics"]["gpus"][uuids[0]]["pcie_max_link_gen"] == 5
    assert scratch["metrics"]["path"] == "/scratch"


def test_the_jitter_is_seeded_by_the_node():
    first, _, _ = make()
    again, _, _ = make()

    assert run(first, "gpu_compute", {}) == run(again, "gpu_compute", {})


def test_a_gpu_in_hw_thermal_slowdown_fails_gpu_compute_by_name():
    runner, backend, clock = make("thermal@10s:gpu2")
    hot = backend.gpus()[2]
    clock.now += 11

    result = run(runner, "gpu_compute", {"min_tflops": 711})

    assert result["status"] == "failed"
    tflops = result["metrics"]["gpus"][hot["uuid"]]["tflops"]
    assert tflops < 711
    assert result["message"] == f"GPU 2 ({hot['uuid']}): {tflops:g} TFLOP/s, below the minimum 711"
    assert result["metrics"]["tflops"] == tflops


def test_before_the_fault_starts_the_same_gpu_passes():
    runner, _, clock = make("thermal@10s:gpu2")
    clock.now += 5

    assert run(runner, "gpu_compute", {"min_tflops": 711})["status"] == "passed"


def test_a_lost_gpu_is_missing_from_the_gpu_checks():
    runner, backend, clock = make("gpu_lost@10s:gpu5")
    lost = backend.gpus()[5]
    clock.now += 11

    compute = run(runner, "gpu_compute", {"min_tflops": 711})
    bandwidth = run(runner, "gpu_memory_bandwidth", {})
    sanity = run(runner, "nvml_sanity", {"expected_gpus": 8})

    assert compute["status"] == "failed"
    assert compute["message"] == f"GPU 5 ({lost['uuid']}): not measured, torch does not see it"
    assert bandwidth["status"] == "failed"
    assert sanity["status"] == "failed"
    assert sanity["message"].split("; ") == [
        "NVML lists 7 GPUs, expected 8",
        f"GPU 5 ({lost['uuid']}): present when the agent started, now missing",
    ]


def test_nccl_is_not_installed_on_a_simulated_node():
    runner, _, _ = make()

    result = run(runner, "nccl", {"min_busbw_gbps": 60})

    assert result == {
        "status": "error",
        "metrics": {"simulated": True},
        "message": "nccl-tests (all_reduce_perf) is not installed on this node (a simulated node)",
    }


@pytest.mark.parametrize(
    "check, params, message",
    [
        (
            "x",
            {},
            "unknown check 'x'; this agent runs: gpu_compute, gpu_memory_bandwidth, nccl, "
            "nvml_sanity, storage",
        ),
        (
            "gpu_compute",
            {"min_tflops": "711"},
            "bad params for gpu_compute: min_tflops: expected a number, got '711'",
        ),
    ],
)
def test_unknown_checks_and_bad_params_are_refused_as_on_a_real_node(check, params, message):
    runner, _, _ = make()

    assert run(runner, check, params) == {"status": "error", "metrics": {}, "message": message}


def test_a_simulated_check_takes_its_time_and_one_runs_at_a_time():
    backend = SimulatedBackend("gpu-001", gpu_count=2)
    runner = SimulatedCheckRunner(backend, "/scratch", duration_s=0.2)

    async def scenario():
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.gather(runner.run("gpu_compute", {}), runner.run("nvml_sanity", {}))
        return loop.time() - started

    assert asyncio.run(scenario()) >= 0.4
