"""CheckRunner and its child processes, for real: each check runs in
`python -m agent.checks child <module>`, and the runner survives whatever the child
does. This machine has neither torch nor CuPy, nor a GPU."""

import asyncio
import os
import stat
import sys
import time
from pathlib import Path

import pytest

from agent.checks import CHECKS
from agent.checks.runner import CheckRunner, run_child
from agent.sim.backend import SimulatedBackend

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MISBEHAVING = {**CHECKS, "misbehave": "agent.tests.fixtures.misbehaving_check"}


def make_runner(scratch_dir, gpu_count=2, **options):
    return CheckRunner(SimulatedBackend("gpu-001", gpu_count=gpu_count), scratch_dir, **options)


def misbehaving_runner(scratch_dir):
    return make_runner(scratch_dir, checks=MISBEHAVING)


def run(runner, check, params=None):
    return asyncio.run(runner.run(check, {} if params is None else params))


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) counts as gone
    with open(f"/proc/{pid}/stat") as stat_file:
        return stat_file.read().split(")")[-1].split()[0] != "Z"


# The compute checks on a node without torch or CuPy


@pytest.mark.parametrize("check", ["gpu_compute", "gpu_memory_bandwidth"])
def test_compute_checks_say_that_neither_torch_nor_cupy_is_installed(tmp_path, check):
    params = {"min_tflops": 711} if check == "gpu_compute" else {}

    result = run(make_runner(tmp_path), check, params)

    assert result == {
        "status": "error",
        "metrics": {},
        "message": f"neither torch nor cupy is installed for {sys.executable}: the compute "
        "checks need one of them on the node",
    }


def test_asking_for_cupy_says_that_cupy_is_not_installed(tmp_path):
    result = run(make_runner(tmp_path), "gpu_compute", {"backend": "cupy"})

    assert result["status"] == "error"
    assert result["message"] == f"cupy is not installed for {sys.executable}"


# What the runner refuses before starting anything


def test_an_unknown_check_is_an_error_naming_the_checks(tmp_path):
    result = run(make_runner(tmp_path), "x")

    assert result == {
        "status": "error",
        "metrics": {},
        "message": "unknown check 'x'; this agent runs: gpu_compute, gpu_memory_bandwidth, "
        "nccl, nvml_sanity, storage",
    }


def test_bad_params_are_an_error_naming_the_param(tmp_path):
    result = run(make_runner(tmp_path), "gpu_compute", {"min_tflops": "711"})

    assert result["status"] == "error"
    assert result["message"] == (
        "bad params for gpu_compute: min_tflops: expected a number, got '711'"
    )


# The child's protocol and what the runner survives


def test_a_measurement_comes_back_and_is_decided(tmp_path):
    runner = misbehaving_runner(tmp_path)

    result = run(runner, "misbehave", {"behaviour": "measure"})

    assert result == {
        "status": "passed",
        "metrics": {"value": 42, "gpus_known": 2},
        "message": "measured 42",
    }


def test_a_check_that_cannot_measure_says_why(tmp_path):
    result = run(misbehaving_runner(tmp_path), "misbehave", {"behaviour": "check_error"})

    assert result["status"] == "error"
    assert result["message"] == "the thing to measure is not there"


def test_a_crash_is_an_error_with_the_end_of_stderr(tmp_path):
    result = run(misbehaving_runner(tmp_path), "misbehave", {"behaviour": "crash"})

    assert result["status"] == "error"
    assert result["message"].startswith("the check's process exited with 1 without a result: ")
    assert "about to fail on purpose" in result["message"]
    assert result["message"].endswith("RuntimeError: boom")


def test_what_libraries_print_on_stdout_does_not_spoil_the_result(tmp_path):
    result = run(misbehaving_runner(tmp_path), "misbehave", {"behaviour": "noisy_stdout"})

    assert result["status"] == "passed"
    assert result["metrics"] == {"value": 43}


def test_at_its_time_limit_the_child_and_its_own_processes_are_stopped(tmp_path):
    marker = tmp_path / "sleep.pid"
    started = time.monotonic()

    result = run(
        misbehaving_runner(tmp_path),
        "misbehave",
        {"behaviour": "hang_with_child", "limit_s": 1, "marker": str(marker)},
    )

    assert result == {"status": "error", "metrics": {}, "message": "timed out after 1 s"}
    assert time.monotonic() - started < 5
    assert not pid_alive(int(marker.read_text()))


def test_at_its_time_limit_the_child_gets_to_clean_up(tmp_path):
    marker = tmp_path / "scratch-file"

    result = run(
        misbehaving_runner(tmp_path),
        "misbehave",
        {"behaviour": "hang_then_clean_up", "limit_s": 1, "marker": str(marker)},
    )

    assert result["message"] == "timed out after 1 s"
    assert not marker.exists()


def test_output_that_is_not_json_is_an_error():
    program = "import sys; print('hello'); print('oops', file=sys.stderr)"

    outcome = asyncio.run(run_child([sys.executable, "-c", program], {}, 5))

    assert outcome == {
        "error": "the check's process exited with 0 and printed no JSON result: oops"
    }


def test_a_child_killed_by_a_signal_is_an_error():
    program = (
        "import os, signal, sys; print('dying', file=sys.stderr, flush=True); "
        "os.kill(os.getpid(), signal.SIGKILL)"
    )

    outcome = asyncio.run(run_child([sys.executable, "-c", program], {}, 5))

    assert outcome == {"error": "the check's process was killed by signal 9 (SIGKILL): dying"}


def test_a_child_that_exits_silently_is_an_error():
    outcome = asyncio.run(run_child([sys.executable, "-c", "import os; os._exit(7)"], {}, 5))

    assert outcome == {
        "error": "the check's process exited with 7 without a result (nothing on stderr)"
    }


def test_a_result_printed_before_a_crash_on_the_way_out_is_kept():
    program = (
        "import json, os, sys; sys.stdout.write(json.dumps({'measurements': {'x': 1}})); "
        "sys.stdout.flush(); os._exit(139)"
    )

    outcome = asyncio.run(run_child([sys.executable, "-c", program], {}, 5))

    assert outcome == {"measurements": {"x": 1}}


def test_a_program_that_cannot_start_is_an_error(tmp_path):
    outcome = asyncio.run(run_child([str(tmp_path / "no-such-python")], {}, 5))

    assert outcome["error"].startswith(
        f"cannot start the check's process {tmp_path / 'no-such-python'}"
    )


def test_one_check_runs_at_a_time_and_a_second_request_waits(tmp_path):
    runner = misbehaving_runner(tmp_path)
    marker = tmp_path / "first-running"

    async def scenario():
        first = asyncio.create_task(
            runner.run(
                "misbehave",
                # 5 s: the first must still run when the second asks, on a busy machine too.
                {"behaviour": "hang_then_clean_up", "limit_s": 5, "marker": str(marker)},
            )
        )
        while not marker.exists():
            await asyncio.sleep(0.01)
        second = asyncio.create_task(runner.run("misbehave", {"behaviour": "measure"}))
        await asyncio.sleep(0.3)
        second_waited = not second.done()
        return await first, await second, second_waited

    first, second, second_waited = asyncio.run(scenario())

    assert second_waited
    assert first["message"] == "timed out after 5 s"
    assert second["status"] == "passed"


def test_cancelling_a_run_stops_its_child(tmp_path):
    runner = misbehaving_runner(tmp_path)
    marker = tmp_path / "sleep.pid"

    async def scenario():
        task = asyncio.create_task(
            runner.run(
                "misbehave",
                {"behaviour": "hang_with_child", "limit_s": 30, "marker": str(marker)},
            )
        )
        while not marker.exists() or not marker.read_text():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.2)

    asyncio.run(scenario())

    assert not pid_alive(int(marker.read_text()))


# storage, for real


def test_storage_measures_tmp_path_and_removes_its_file(tmp_path):
    result = run(
        make_runner(tmp_path),
        "storage",
        {"bytes": 4 * 2**20, "min_write_mbps": 0.001, "min_read_mbps": 0.001},
    )

    assert result["status"] == "passed", result
    assert result["metrics"]["path"] == str(tmp_path)
    assert result["metrics"]["bytes"] == 4 * 2**20
    assert result["metrics"]["write_mbps"] > 0
    assert result["metrics"]["read_mbps"] > 0
    assert result["metrics"]["page_cache_dropped"] is True
    assert list(tmp_path.iterdir()) == []


def test_storage_fails_below_an_impossible_minimum(tmp_path):
    result = run(make_runner(tmp_path), "storage", {"bytes": 2**20, "min_write_mbps": 1e9})

    assert result["status"] == "failed"
    assert result["message"].startswith(f"write ")
    assert result["message"].endswith(f" MB/s on {tmp_path}, below the minimum 1e+09")
    assert list(tmp_path.iterdir()) == []


def test_storage_on_a_missing_path_is_an_error(tmp_path):
    result = run(make_runner(tmp_path), "storage", {"path": str(tmp_path / "nope"), "bytes": 2**20})

    assert result == {
        "status": "error",
        "metrics": {},
        "message": f"{tmp_path / 'nope'} does not exist",
    }


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_storage_on_a_read_only_directory_is_an_error(tmp_path):
    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o555)

    result = run(make_runner(tmp_path), "storage", {"path": str(read_only), "bytes": 2**20})

    assert result["status"] == "error"
    assert result["message"].startswith(f"{read_only} is not writable by the agent")


def test_storage_on_a_file_is_an_error(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("")

    result = run(make_runner(tmp_path), "storage", {"path": str(a_file), "bytes": 2**20})

    assert result["message"] == f"{a_file} is not a directory"


# nccl


def test_nccl_without_nccl_tests_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # the child inherits it: no all_reduce_perf

    result = run(make_runner(tmp_path, gpu_count=8), "nccl", {"min_busbw_gbps": 60})

    assert result == {
        "status": "error",
        "metrics": {},
        "message": "nccl-tests (all_reduce_perf) is not installed on this node",
    }


def fake_all_reduce_perf(tmp_path, output_fixture, exit_code=0):
    """An all_reduce_perf that records its arguments and prints a real run's output."""
    binary = tmp_path / "all_reduce_perf"
    binary.write_text(
        "#!/bin/sh\n"
        f'echo "$@" > {tmp_path / "arguments"}\n'
        f"cat {FIXTURES / 'nccl' / output_fixture}\n"
        f"exit {exit_code}\n"
    )
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    return binary


def test_nccl_runs_all_reduce_perf_across_the_nodes_gpus_and_reads_its_output(
    tmp_path, monkeypatch
):
    fake_all_reduce_perf(tmp_path, "all_reduce_perf_8xA100_sweep.txt")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")

    result = run(make_runner(tmp_path, gpu_count=8), "nccl", {"min_busbw_gbps": 60})

    assert (tmp_path / "arguments").read_text() == "-b 8 -e 1G -f 2 -g 8\n"
    assert result["status"] == "passed"
    assert result["metrics"]["avg_busbw_gbps"] == 66.2058
    assert result["metrics"]["gpus"] == 8


def test_a_configured_all_reduce_perf_is_used(tmp_path):
    binary = fake_all_reduce_perf(tmp_path, "all_reduce_perf_8xA100_sweep.txt")

    runner = make_runner(tmp_path, gpu_count=4, all_reduce_perf=str(binary))

    result = run(runner, "nccl", {"min_busbw_gbps": 80})

    assert (tmp_path / "arguments").read_text() == "-b 8 -e 1G -f 2 -g 4\n"
    assert result["status"] == "failed"
    assert result["message"] == "average bus bandwidth 66.2058 GB/s, below the minimum 80"


def test_all_reduce_perf_that_prints_no_summary_is_an_error_with_its_output(tmp_path):
    binary = tmp_path / "all_reduce_perf"
    binary.write_text("#!/bin/sh\necho 'NCCL WARN Cuda failure: out of memory'\nexit 1\n")
    binary.chmod(0o755)

    result = run(make_runner(tmp_path, gpu_count=8, all_reduce_perf=str(binary)), "nccl")

    assert result["status"] == "error"
    assert result["message"] == (
        f"{binary} -b 8 -e 1G -f 2 -g 8 exited with 1 and printed no 'Avg bus bandwidth' "
        "line: NCCL WARN Cuda failure: out of memory"
    )


def test_nccl_on_a_one_gpu_node_is_an_error(tmp_path):
    binary = fake_all_reduce_perf(tmp_path, "all_reduce_perf_8xA100_sweep.txt")

    result = run(make_runner(tmp_path, gpu_count=1, all_reduce_perf=str(binary)), "nccl")

    assert result["message"] == (
        "an all-reduce needs at least 2 GPUs; the agent lists 1 on this node"
    )


# nvml_sanity's child, on this machine without the NVIDIA driver


def test_nvml_sanity_without_the_driver_is_an_error(tmp_path):
    result = run(make_runner(tmp_path), "nvml_sanity", {"expected_gpus": 8})

    assert result["status"] == "error"
    assert result["message"].startswith("NVML cannot start: ")
