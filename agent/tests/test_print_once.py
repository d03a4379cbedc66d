"""`python -m agent --print-once --simulate`: two JSON lines that follow PROTOCOL.md."""

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent.config import parse_inject
from agent.detectors.ecc import EccWatcher
from agent.detectors.throttle import ThrottleWatcher
from agent.detectors.xid import XidWatcher
from agent.sim.backend import SimulatedBackend
from agent.tests.protocol_validator import problems

REPO = Path(__file__).resolve().parents[2]


def run_agent(*args):
    return subprocess.run(
        [sys.executable, "-m", "agent", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.fixture(scope="module")
def printed(tmp_path_factory):
    state_dir = tmp_path_factory.mktemp("state")
    result = run_agent(
        "--print-once", "--simulate", "--node-name", "gpu-042", "--state-dir", str(state_dir)
    )
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_it_prints_a_hello_and_a_sample(printed):
    assert [frame["type"] for frame in printed] == ["hello", "sample"]


def test_both_lines_follow_the_protocol(printed):
    hello, sample = printed
    assert problems(hello) == []
    assert problems(sample) == []


def test_the_hello_describes_8_simulated_h200s(printed):
    hello, sample = printed
    assert hello["node"] == "gpu-042"
    assert hello["driver_version"] == "580.159.04"
    assert hello["cuda_version"] == "13.0"
    assert hello["slurm"] is None  # no scontrol here
    assert [gpu["index"] for gpu in hello["gpus"]] == list(range(8))
    assert {gpu["name"] for gpu in hello["gpus"]} == {"NVIDIA H200"}
    assert {gpu["memory_total_bytes"] for gpu in hello["gpus"]} == {150754820096}
    assert [gpu["uuid"] for gpu in sample["gpus"]] == [gpu["uuid"] for gpu in hello["gpus"]]
    assert sample["seq"] == 0


def test_simulated_gpus_can_be_counted(tmp_path):
    result = run_agent("--print-once", "--simulate", "--gpus", "3", "--state-dir", str(tmp_path))

    hello, sample = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(hello["gpus"]) == 3 and len(sample["gpus"]) == 3


def test_simulated_events_follow_the_protocol():
    clock = [0.0]
    backend = SimulatedBackend(
        "gpu-042",
        faults=parse_inject("xid:79@0s,gpu_lost@0s:gpu1,thermal@0s+2s:gpu2,ecc_dbe@1s:gpu3"),
        clock=lambda: clock[0],
    )
    watchers = [
        ThrottleWatcher(hold_s=1, clock=lambda: clock[0]),
        EccWatcher(clock=lambda: clock[0]),
        XidWatcher(backend.gpus(), [backend.kernel_log], clock=lambda: clock[0]),
    ]
    events = []
    for second in range(5):
        clock[0] = float(second)
        readings = backend.read_gpus()
        events += backend.take_events()
        for watcher in watchers:
            events += watcher.poll(readings)

    # xid, gpu_lost, thermal active, ecc_dbe, thermal cleared
    assert len(events) == 5
    for event in events:
        assert problems(event) == []


@pytest.mark.parametrize(
    "path, bad_value",
    [
        (("seq",), 812.0),
        (("seq",), True),
        (("ts",), "1764442000.1"),
        (("gpus", 0, "temp_c"), "55"),
        (("gpus", 0, "util_pct"), True),
        (("gpus", 0, "clock_event_reasons"), 4.0),
        (("node", "cpu_pct"), "12.5"),
    ],
)
def test_the_validator_catches_ill_typed_samples(printed, path, bad_value):
    sample = copy.deepcopy(printed[1])
    target = sample
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = bad_value

    assert problems(sample) != []


@pytest.mark.parametrize(
    "change",
    [
        {"node": "x" * 64},
        {"node": "gpu 001"},
        {"boot_id": None},
        {"gpus": [{"uuid": "GPU-1"}]},
        {"gpus": [{"index": 0.0, "uuid": "GPU-1"}]},
    ],
)
def test_the_validator_catches_bad_hellos(printed, change):
    assert problems({**printed[0], **change}) != []
