"""make_watchers(): the set of watchers per backend, started and closed; and the agent
(python -m agent) running them, against a real WebSocket server on 127.0.0.1."""

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agent.backends.nvml import NvmlBackend
from agent.config import Config
from agent.detectors import close_watchers, make_watchers
from agent.detectors.ecc import EccWatcher
from agent.detectors.kernel_log import KmsgReader
from agent.detectors.nvml_xid import NvmlXidEvents
from agent.detectors.recovery_action import RecoveryActionWatcher
from agent.detectors.row_remap import RowRemapWatcher
from agent.detectors.slurm_drain import SlurmDrainWatcher
from agent.detectors.throttle import ThrottleWatcher
from agent.detectors.xid import XidWatcher
from agent.sim.backend import SimulatedBackend, simulated_gpu_uuid
from agent.sim.node import simulated_watchers
from agent.tests.fake_pynvml import FakeNvml
from agent.tests.fake_server import FakeServer, until
from agent.tests.test_detectors_slurm import FakeScontrol

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_scontrol(tmp_path, monkeypatch):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


@pytest.fixture
def nvml_backend():
    fake = FakeNvml(gpu_count=2)
    backend = NvmlBackend(nvml=fake)
    yield fake, backend
    backend.close()


def kinds(watchers):
    return [type(watcher) for watcher in watchers]


def test_the_simulated_backend_gets_the_reading_watchers_and_its_kernel_log():
    backend = SimulatedBackend("gpu-001", gpu_count=2)

    watchers = simulated_watchers(Config(node_name="gpu-001", throttle_hold_s=3), backend)
    close_watchers(watchers)

    assert kinds(watchers) == [ThrottleWatcher, EccWatcher, XidWatcher]
    assert watchers[0].hold_s == 3
    assert watchers[2].sources == [backend.kernel_log]


def test_the_nvml_backend_gets_every_watcher_with_its_threads(tmp_path, no_scontrol, nvml_backend):
    fake, backend = nvml_backend
    (tmp_path / "kmsg").write_text("")

    watchers = make_watchers(Config(node_name="gpu-001", kmsg_path=str(tmp_path / "kmsg")), backend)
    xid = watchers[2]
    threads = [source._thread for source in xid.sources] + [w._thread for w in watchers[3:]]
    alive = [thread.is_alive() for thread in threads]
    close_watchers(watchers)

    assert kinds(watchers) == [
        ThrottleWatcher,
        EccWatcher,
        XidWatcher,
        RowRemapWatcher,
        RecoveryActionWatcher,
    ]
    assert [type(source) for source in xid.sources] == [KmsgReader, NvmlXidEvents]
    assert xid.sources[0].path == str(tmp_path / "kmsg")
    assert alive == [True] * 4
    assert [thread.is_alive() for thread in threads] == [False] * 4
    assert fake.event_sets[0].freed


def test_without_a_readable_kernel_log_xids_come_from_nvml_only(tmp_path, no_scontrol, nvml_backend):
    _, backend = nvml_backend

    watchers = make_watchers(Config(node_name="gpu-001", kmsg_path=str(tmp_path / "no")), backend)
    close_watchers(watchers)

    [xid] = [w for w in watchers if isinstance(w, XidWatcher)]
    assert [type(source) for source in xid.sources] == [NvmlXidEvents]


def test_where_scontrol_exists_a_real_nodes_slurm_drains_are_watched(
    tmp_path, monkeypatch, nvml_backend
):
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", str(folder))
    FakeScontrol(folder).show("IDLE")
    _, backend = nvml_backend

    watchers = make_watchers(Config(node_name="gpu-001", kmsg_path=str(tmp_path / "no")), backend)
    close_watchers(watchers)
    simulated = simulated_watchers(Config(node_name="gpu-001"), SimulatedBackend("gpu-001"))

    assert kinds(watchers)[-1] is SlurmDrainWatcher
    assert watchers[-1].node_name == "gpu-001"
    assert SlurmDrainWatcher not in kinds(simulated)


def test_an_unknown_backend_is_refused():
    class OtherBackend:
        def gpus(self):
            return []

    with pytest.raises(TypeError, match="no watchers for a OtherBackend"):
        make_watchers(Config(node_name="gpu-001"), OtherBackend())


def test_the_agent_runs_the_watchers_and_stops_them_on_sigterm(tmp_path):
    async def scenario():
        async with FakeServer() as server:
            agent = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "agent",
                "--server", server.url,
                "--state-dir", str(tmp_path), "--node-name", "gpu-001",
                "--simulate", "--gpus", "2", "--sample-interval", "0.2",
                "--inject", "xid:79@0s:gpu1,thermal@0s:gpu0", "--throttle-hold", "1",
                cwd=REPO,
                env={**os.environ, "PATH": str(tmp_path),  # no scontrol
                     "CLUSTERUI_AGENT_TOKEN": "join-1"},
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                await until(
                    lambda: server.connections
                    and {"xid:79", "thermal_throttle"}
                    <= {e["signature"] for e in server.connections[0].of_type("event")},
                    timeout_s=15,
                )
            finally:
                agent.send_signal(signal.SIGTERM)
                _, stderr = await asyncio.wait_for(agent.communicate(), timeout=15)
            return server.connections[0].of_type("event"), agent.returncode, stderr.decode()

    events, returncode, stderr = asyncio.run(scenario())

    assert returncode == 0, stderr
    assert "stopping" in stderr
    by_signature = {event["signature"]: event for event in events}
    assert by_signature["xid:79"]["gpu_uuid"] == simulated_gpu_uuid("gpu-001", 1)
    assert by_signature["xid:79"]["detail"]["source"] == "simulated_kmsg"
    assert by_signature["thermal_throttle"]["gpu_uuid"] == simulated_gpu_uuid("gpu-001", 0)


def run_detectors(*args):
    return subprocess.run(
        [sys.executable, "-m", "agent.detectors", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_the_detectors_script_prints_the_events_of_a_simulated_node():
    result = run_detectors(
        "--simulate", "--inject", "xid:79@0s:gpu3,ecc_dbe@0.5s:gpu1",
        "--seconds", "1.2", "--interval", "0.2",
    )

    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert [event["signature"] for event in events] == ["xid:79", "ecc_dbe"]
    assert "running XidWatcher reading simulated_kmsg" in result.stderr


def test_the_detectors_script_without_a_driver_says_so_and_exits_2():
    # No NVIDIA driver on this machine: the real pynvml cannot find libnvidia-ml.
    result = run_detectors("--seconds", "1")

    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "agent.detectors: the NVIDIA driver is not installed here: NVML (libnvidia-ml.so.1) "
        "was not found. Install the driver, or run with --simulate."
    ]
