"""The Slurm drain watcher against a fake `scontrol` on PATH that prints what a real
Slurm 22.05 prints for `scontrol show node <name> -o` (see shared/notes/slurm-in-tests.md)."""

import logging
import os
import time

import pytest

from agent import host
from agent.detectors.slurm_drain import SlurmDrainWatcher

NODE_LINE = (
    "NodeName=gpu-001 Arch=x86_64 CoresPerSocket=48 CPUAlloc=0 CPUEfctv=192 CPUTot=192 "
    "CPULoad=0.52 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:h200:8 "
    "NodeAddr=gpu-001 NodeHostName=gpu-001 Version=22.05.8 OS=Linux 6.1.0-27-amd64 "
    "RealMemory=2063000 AllocMem=0 FreeMem=1980000 Sockets=2 Boards=1 State={state} "
    "ThreadsPerCore=2 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu "
    "BootTime=2026-11-29T09:12:44 SlurmdStartTime=2026-11-29T09:13:02 "
    "LastBusyTime=2026-11-29T14:01:57 CfgTRES=cpu=192,mem=2063000M,billing=192,gres/gpu=8 "
    "AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s "
    "ExtSensorsWatts=0 ExtSensorsTemp=n/s{reason}"
)


class FakeScontrol:
    """An executable `scontrol` in a folder put first on PATH. It prints the node line
    the test sets, or fails as scontrol does when slurmctld is down."""

    def __init__(self, folder):
        self.line_file = folder / "node_line"
        script = folder / "scontrol"
        script.write_text(
            "#!/bin/sh\n"
            f'echo "$@" >> "{folder}/calls"\n'
            f'if [ -f "{self.line_file}" ]; then cat "{self.line_file}"; exit 0; fi\n'
            'echo "slurm_load_node error: Unable to contact slurm controller (connect '
            'failure)" >&2\n'
            "exit 1\n"
        )
        script.chmod(0o755)
        self.calls_file = folder / "calls"

    def show(self, state, reason=None):
        suffix = f" Reason={reason}" if reason else ""
        self.line_file.write_text(NODE_LINE.format(state=state, reason=suffix) + "\n")

    def fail(self):
        self.line_file.unlink(missing_ok=True)

    def calls(self):
        return self.calls_file.read_text().splitlines()


@pytest.fixture
def scontrol(tmp_path, monkeypatch):
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return FakeScontrol(folder)


def test_a_foreign_drain_opens_and_its_end_clears(scontrol):
    watcher = SlurmDrainWatcher("gpu-001")

    scontrol.show("IDLE")
    assert watcher.check_once() == []
    scontrol.show("IDLE+DRAIN", "Kill task failed [root@2026-11-29T14:02:11]")
    [drain] = watcher.check_once()
    assert watcher.check_once() == []
    scontrol.show("IDLE")
    [cleared] = watcher.check_once()
    assert watcher.check_once() == []

    assert (drain["signature"], drain["severity"], drain["state"], drain["gpu_uuid"]) == (
        "slurm_drain",
        "warning",
        "active",
        None,
    )
    assert drain["detail"] == {
        "state": "IDLE+DRAIN",
        "reason": "Kill task failed [root@2026-11-29T14:02:11]",
    }
    assert drain["message"] == "Slurm drained gpu-001: Kill task failed [root@2026-11-29T14:02:11]"
    assert (cleared["signature"], cleared["gpu_uuid"], cleared["state"]) == (
        "slurm_drain",
        None,
        "cleared",
    )
    assert cleared["id"] != drain["id"]
    assert scontrol.calls() == ["show node gpu-001 -o"] * 5


def test_clusterui_s_own_drain_is_ignored(scontrol):
    watcher = SlurmDrainWatcher("gpu-001")

    scontrol.show("MIXED+DRAIN", "clusterui: repair 12 (reboot) [root@2026-11-29T14:05:00]")
    assert watcher.check_once() == []
    scontrol.show("IDLE")
    assert watcher.check_once() == []


def test_clusterui_taking_over_a_foreign_drain_clears_it(scontrol):
    watcher = SlurmDrainWatcher("gpu-001")

    scontrol.show("DOWN+DRAIN", "Not responding [slurm@2026-11-29T14:02:11]")
    [drain] = watcher.check_once()
    scontrol.show("IDLE+DRAIN", "clusterui: repair 12 (reboot) [root@2026-11-29T14:05:00]")
    [cleared] = watcher.check_once()

    assert (drain["state"], cleared["state"]) == ("active", "cleared")


def test_a_new_foreign_reason_is_another_event(scontrol):
    watcher = SlurmDrainWatcher("gpu-001")

    scontrol.show("IDLE+DRAIN", "disk full [root@2026-11-29T14:02:11]")
    [first] = watcher.check_once()
    scontrol.show("IDLE+DRAIN", "bad DIMM [ops@2026-11-29T15:00:00]")
    [second] = watcher.check_once()

    assert [first["detail"]["reason"], second["detail"]["reason"]] == [
        "disk full [root@2026-11-29T14:02:11]",
        "bad DIMM [ops@2026-11-29T15:00:00]",
    ]
    assert second["state"] == "active"


def test_scontrol_failing_changes_nothing_and_is_logged_once(scontrol, caplog):
    caplog.set_level(logging.WARNING)
    watcher = SlurmDrainWatcher("gpu-001")
    scontrol.show("IDLE+DRAIN", "disk full [root@2026-11-29T14:02:11]")
    watcher.check_once()

    scontrol.fail()
    assert [watcher.check_once() for _ in range(3)] == [[]] * 3
    scontrol.show("IDLE+DRAIN", "disk full [root@2026-11-29T14:02:11]")
    assert watcher.check_once() == []  # the same drain: no new event

    [record] = caplog.records
    assert "Unable to contact slurm controller" in record.getMessage()


def test_the_thread_polls_scontrol_and_hands_the_event_over(scontrol):
    scontrol.show("IDLE+DRAIN", "Kill task failed [root@2026-11-29T14:02:11]")
    watcher = SlurmDrainWatcher("gpu-001", interval_s=0.05)
    watcher.start()
    try:
        deadline = time.monotonic() + 5
        events = []
        while not events:
            assert time.monotonic() < deadline
            time.sleep(0.01)
            events = watcher.poll([])
    finally:
        watcher.close()

    assert [e["signature"] for e in events] == ["slurm_drain"]
    assert not watcher._thread.is_alive()


def test_the_hellos_slurm_status_comes_from_the_same_scontrol(scontrol):
    scontrol.show("IDLE+DRAIN", "Kill task failed [root@2026-11-29T14:02:11]")

    assert host.slurm_status("gpu-001") == {
        "state": "IDLE+DRAIN",
        "reason": "Kill task failed [root@2026-11-29T14:02:11]",
    }
