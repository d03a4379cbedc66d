"""The agent's slurmd and gres hygiene against real Slurm 22.05 daemons.

A small cluster of its own (hyg-001, hyg-002, no accounting) for this module, not the
session's `slurm` fixture: these tests kill slurmd and have the agent start it again in
place (`slurmd -N hyg-001`, which daemonizes), and they break gres.conf. SlurmCluster.stop()
stops such a slurmd too, by its pid file. The GPUs are the harness's fake device files; NVML
is the agent's fake with 8 GPUs (minor numbers 0-7). They also show what the repair relies
on: a Name=gpu line without NodeName= applies to every node and adds to a node's own line,
and `scontrol show config` says whether slurmctld serves the configuration (configless)."""

import os
import re
import shutil
import signal
import stat
import tempfile
import time
from pathlib import Path

import pytest

from agent.hygiene.gres import (
    GresWatcher,
    ReconfigureFailed,
    compare,
    nvml_gpus,
    reconfigure,
    slurm_view,
)
from agent.hygiene.slurmd import SlurmdWatcher, live_slurmd_started_at
from agent.tests.fake_pynvml import FakeNvml

from .slurm import SlurmCluster, missing_requirements, wait_for

NODE = "hyg-001"


@pytest.fixture(scope="module")
def cluster():
    lacking = missing_requirements()
    if lacking:
        pytest.skip(f"a real Slurm cluster needs {lacking}")
    # In /tmp, not pytest's tmp_path: munged wants every folder above its socket
    # world-executable.
    directory = Path(tempfile.mkdtemp(prefix="clusterui-hygiene.", dir="/tmp"))
    cluster = SlurmCluster(directory, nodes=[NODE, "hyg-002"], accounting=False)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def node(cluster, monkeypatch, request):
    """hyg-001, with SLURM_CONF set for the agent's scontrol and slurmd; afterwards its
    gres.conf as it was, its slurmd the harness's again and the node back in service. A
    failed test prints the end of the daemons' logs."""
    monkeypatch.setenv("SLURM_CONF", str(cluster.slurm_conf))
    gres_conf = cluster.etc / "gres.conf"
    original = gres_conf.read_text()
    yield NODE
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(f"Slurm logs (tail):\n{cluster.log_tails()}")
    gres_conf.write_text(original)
    daemon = cluster.daemons[f"slurmd {NODE}"]
    daemon.stop()
    cluster.stop_restarted_slurmd(NODE)
    daemon.start()
    wait_for(lambda: "INVALID_REG" not in node_fields(cluster)["State"], timeout=30,
             what=f"{NODE} registered again", alive=[daemon])
    cluster.reset()


def node_fields(cluster):
    line = cluster.run(["scontrol", "show", "node", NODE, "-o"]).stdout
    return {"Gres": re.search(r"\bGres=(\S+)", line).group(1),
            "State": re.search(r"\bState=(\S+)", line).group(1),
            "Reason": line.split(" Reason=", 1)[1].strip() if " Reason=" in line else None}


def kill_and_wait(pid):
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while live_slurmd_started_at(pid) is not None:
        assert time.monotonic() < deadline, f"slurmd {pid} outlived SIGKILL"
        time.sleep(0.05)


def test_a_killed_slurmd_is_restarted_and_the_third_kill_in_a_row_is_flapping(cluster, node):
    watcher = SlurmdWatcher(node_name=NODE, watched_by="process",
                            pid_file=str(cluster.directory / "run" / f"slurmd-{NODE}.pid"),
                            restart_command=f"slurmd -N {NODE}")
    # The first check since the agent started clears a slurmd_down the server may hold.
    [cleared] = watcher.check_once()
    assert (cleared["signature"], cleared["state"]) == ("slurmd_down", "cleared")
    pids = [watcher.status()["pid"]]
    assert pids[0] == cluster.daemons[f"slurmd {NODE}"].process.pid

    found = []
    for kill in range(3):
        kill_and_wait(pids[-1])
        found.append(watcher.check_once())
        pids.append(watcher.status()["pid"])
        assert live_slurmd_started_at(pids[-1]) is not None
        assert cluster.slurmd_pid(NODE) == pids[-1]
        cluster.wait_nodes_ready(nodes=[NODE])
        assert cluster.node_states()[NODE] == "idle"
    # The restarted slurmd runs jobs (not between the kills: a kill while a job ends leaves
    # the node completing until slurmctld sends the job's end again).
    cluster.run(["srun", "-w", NODE, "-N", "1", "true"], timeout=30)
    cluster.wait_nodes_ready(nodes=[NODE])

    assert [[e["signature"] for e in events] for events in found] == [
        ["slurmd_restarted"], ["slurmd_restarted"], ["slurmd_restarted", "slurmd_flapping"]]
    restarted = [events[0] for events in found]
    assert [e["detail"]["previous_pid"] for e in restarted] == pids[:3]
    assert [e["detail"]["pid"] for e in restarted] == pids[1:]
    assert [e["detail"]["restarts_in_window"] for e in restarted] == [1, 2, 3]
    assert restarted[0]["detail"]["command"] == f"slurmd -N {NODE}"
    flapping = found[2][1]
    assert flapping["severity"] == "warning"
    assert flapping["detail"]["restarts"] == 3 and len(flapping["detail"]["restart_times"]) == 3
    assert watcher.status()["restarts"] == 3 and watcher.status()["state"] == "running"


def test_a_gres_conf_one_gpu_short_is_drift_and_reconfigure_repairs_it(cluster, node):
    dev = cluster.directory / "dev"
    gres_conf = cluster.etc / "gres.conf"
    # hyg-001 shares a line with hyg-002 and lost its 8th GPU; hyg-002 has its own.
    short = (f"AutoDetect=off\n"
             f"# hyg-001's nvidia7 line went missing\n"
             f"NodeName=hyg-00[1-2] Name=gpu File={dev}/nvidia[0-6]\n"
             f"NodeName=hyg-002 Name=gpu File={dev}/nvidia7\n")
    gres_conf.write_text(short)
    # The pid file from `scontrol show config`, the restart command the default one.
    slurmd = SlurmdWatcher(node_name=NODE, watched_by="process")
    ok, message = slurmd.restart_now("the test broke gres.conf")
    assert ok, message
    wait_for(lambda: "INVALID_REG" in node_fields(cluster)["State"], timeout=20,
             what=f"Slurm marks {NODE} invalid")
    assert node_fields(cluster)["Gres"] == "gpu:8"  # the configured count, not the reported
    nvml = FakeNvml(gpu_count=8)
    watcher = GresWatcher(node_name=NODE, read_gpus=lambda: nvml_gpus(nvml, device_dir=str(dev)))

    [drift] = watcher.check_once()
    assert drift["signature"] == "gres_drift" and drift["severity"] == "warning"
    assert drift["message"] == (f"Slurm's view of {NODE}'s GPUs differs from the hardware: "
                                "gres.conf names 7 GPUs, NVML sees 8")
    assert drift["detail"]["problems"] == [
        f"gres.conf has no line for {dev}/nvidia7 (GPU 7, {nvml.uuid(7)})",
        f"Slurm marked {NODE} invalid: gres/gpu count reported lower than configured (7 < 8)",
    ]

    result = reconfigure(node_name=NODE, gpus=nvml_gpus(nvml, device_dir=str(dev)),
                         gres_conf=None, device_dir=str(dev),
                         restart_slurmd=lambda: slurmd.restart_now("gres.conf rewritten"))

    assert result["after"] == [] and result["gres"] == "gpu:8"
    assert result["before"] == drift["detail"]["problems"]
    assert gres_conf.read_text() == (f"AutoDetect=off\n"
                                     f"# hyg-001's nvidia7 line went missing\n"
                                     f"NodeName=hyg-002 Name=gpu File={dev}/nvidia[0-6]\n"
                                     f"NodeName={NODE} Name=gpu File={dev}/nvidia[0-7]\n"
                                     f"NodeName=hyg-002 Name=gpu File={dev}/nvidia7\n")
    assert (cluster.etc / "gres.conf.clusterui-backup").read_text() == short
    fields = node_fields(cluster)
    assert (fields["Gres"], fields["State"], fields["Reason"]) == ("gpu:8", "IDLE", None)
    assert cluster.node_states()[NODE] == "idle"
    assert compare(nvml_gpus(nvml, device_dir=str(dev)), slurm_view(NODE)).match
    [cleared] = watcher.check_once()
    assert (cleared["signature"], cleared["state"]) == ("gres_drift", "cleared")
    # An agent started now (the drift may still be open on the server) clears it too.
    restarted = GresWatcher(node_name=NODE,
                            read_gpus=lambda: nvml_gpus(nvml, device_dir=str(dev)))
    assert [(e["signature"], e["state"]) for e in restarted.check_once()] == [
        ("gres_drift", "cleared")]
    # All 8 GPUs can be had again.
    job = cluster.run(["srun", "-w", NODE, "--gres=gpu:8", "sh", "-c",
                       "echo $CUDA_VISIBLE_DEVICES"], timeout=30)
    assert job.stdout.strip() == "0,1,2,3,4,5,6,7"


def test_a_gpu_count_slurm_conf_does_not_give_is_refused_before_the_node_is_touched(cluster,
                                                                                    node):
    # NVML sees a 9th GPU (its device file made for the test); slurm.conf gives hyg-001 8.
    dev = cluster.directory / "dev"
    os.mknod(dev / "nvidia8", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    gres_conf = cluster.etc / "gres.conf"
    before = gres_conf.read_text()
    restarts = []
    try:
        with pytest.raises(ReconfigureFailed) as failed:
            reconfigure(node_name=NODE, gpus=nvml_gpus(FakeNvml(gpu_count=9),
                                                       device_dir=str(dev)),
                        gres_conf=None, device_dir=str(dev),
                        restart_slurmd=lambda: restarts.append(1) or (True, "restarted"))
    finally:
        (dev / "nvidia8").unlink()

    assert str(failed.value).startswith(
        f"slurmctld refused Gres=gpu:9 for {NODE} (scontrol update NodeName={NODE} "
        "Gres=gpu:9 failed: slurm_update error: Invalid generic resource (gres) "
        "specification); Slurm takes this count from slurm.conf")
    assert "Attempt to change gres/gpu Count on node hyg-001 from 8 to 9 invalid with File " \
           "configuration" in (cluster.logs / "slurmctld.log").read_text()
    assert gres_conf.read_text() == before and restarts == []
    assert node_fields(cluster)["Gres"] == "gpu:8" and cluster.node_states()[NODE] == "idle"


def test_a_shared_line_is_kept_and_the_node_gets_a_line_for_the_gpus_it_leaves_out(cluster,
                                                                                   node):
    # One gres.conf for the cluster whose line without NodeName= names 7 GPUs: hyg-001 is
    # marked invalid; the repair must not touch that line (hyg-002 reads it too).
    dev = cluster.directory / "dev"
    gres_conf = cluster.etc / "gres.conf"
    shared = (f"AutoDetect=off\n"
              f"Name=gpu File={dev}/nvidia[0-6]\n"
              f"NodeName=hyg-002 Name=gpu File={dev}/nvidia7\n")
    gres_conf.write_text(shared)
    slurmd = SlurmdWatcher(node_name=NODE, watched_by="process")
    ok, message = slurmd.restart_now("the test broke gres.conf")
    assert ok, message
    wait_for(lambda: "INVALID_REG" in node_fields(cluster)["State"], timeout=20,
             what=f"Slurm marks {NODE} invalid")
    gpus = nvml_gpus(FakeNvml(gpu_count=8), device_dir=str(dev))

    result = reconfigure(node_name=NODE, gpus=gpus, gres_conf=None, device_dir=str(dev),
                         restart_slurmd=lambda: slurmd.restart_now("gres.conf rewritten"))

    assert gres_conf.read_text() == shared + f"NodeName={NODE} Name=gpu File={dev}/nvidia7\n"
    assert result["after"] == []
    fields = node_fields(cluster)
    assert (fields["Gres"], fields["State"], fields["Reason"]) == ("gpu:8", "IDLE", None)
    job = cluster.run(["srun", "-w", NODE, "--gres=gpu:8", "sh", "-c",
                       "echo $CUDA_VISIBLE_DEVICES"], timeout=30)
    assert job.stdout.strip() == "0,1,2,3,4,5,6,7"


def test_a_shared_line_naming_a_gpu_the_node_lacks_is_refused_with_nothing_changed(cluster,
                                                                                 node):
    # NVML sees 7 GPUs; the cluster's one line without NodeName= names 8.
    dev = cluster.directory / "dev"
    gres_conf = cluster.etc / "gres.conf"
    shared = f"AutoDetect=off\nName=gpu File={dev}/nvidia[0-7]\n"
    gres_conf.write_text(shared)
    backup = cluster.etc / "gres.conf.clusterui-backup"
    backup.unlink(missing_ok=True)  # an earlier test's repair left one
    restarts = []

    with pytest.raises(ReconfigureFailed) as failed:
        reconfigure(node_name=NODE, gpus=nvml_gpus(FakeNvml(gpu_count=7), device_dir=str(dev)),
                    gres_conf=None, device_dir=str(dev),
                    restart_slurmd=lambda: restarts.append(1) or (True, "restarted"))

    assert str(failed.value).startswith(
        f"{gres_conf}: gres.conf's Name=gpu line without NodeName= (`Name=gpu "
        f"File={dev}/nvidia[0-7]`) name {dev}/nvidia7, which {NODE} does not have")
    assert gres_conf.read_text() == shared and restarts == []
    assert not backup.exists()
    assert node_fields(cluster)["Gres"] == "gpu:8" and cluster.node_states()[NODE] == "idle"


def test_configless_slurm_is_refused(cluster, node):
    dev = cluster.directory / "dev"
    gres_conf = cluster.etc / "gres.conf"
    original = gres_conf.read_text()
    broken = (f"AutoDetect=off\nNodeName={NODE} Name=gpu File={dev}/nvidia[0-6]\n"
              f"NodeName=hyg-002 Name=gpu File={dev}/nvidia[0-7]\n")
    cluster.set_conf(SlurmctldParameters="enable_configless")  # scontrol reconfigure
    try:
        gres_conf.write_text(broken)  # after the reconfigure: the slurmds keep 8 GPUs
        with pytest.raises(ReconfigureFailed) as failed:
            reconfigure(node_name=NODE,
                        gpus=nvml_gpus(FakeNvml(gpu_count=8), device_dir=str(dev)),
                        gres_conf=None, device_dir=str(dev),
                        restart_slurmd=lambda: (True, "restarted"))
        assert gres_conf.read_text() == broken
    finally:
        gres_conf.write_text(original)
        cluster.set_conf(SlurmctldParameters=None)

    assert str(failed.value).startswith(
        f"Slurm runs configless here (SlurmctldParameters=enable_configless): {NODE} reads "
        "gres.conf from slurmctld, there is no local gres.conf to edit.")
