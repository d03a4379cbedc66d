import os
import stat
import subprocess

from agent import host
from agent.connection.node_token import read_node_token, save_node_token
from agent.sim import boot

SCONTROL_LINE = (
    "NodeName=gpu-001 Arch=x86_64 CoresPerSocket=48 CPUAlloc=0 CPUTot=192 "
    "Gres=gpu:h200:8 NodeAddr=gpu-001 State=IDLE+DRAIN ThreadsPerCore=2 "
    "Reason=Kill task failed [root@2026-11-29T14:02:11] Comment=(null)"
)


def test_scontrol_line_keeps_a_reason_with_spaces_whole():
    fields = host.parse_scontrol_line(SCONTROL_LINE)

    assert fields["State"] == "IDLE+DRAIN"
    assert fields["Reason"] == "Kill task failed [root@2026-11-29T14:02:11]"
    assert fields["Gres"] == "gpu:h200:8"


def test_slurm_is_null_without_scontrol(monkeypatch):
    monkeypatch.setattr(host.shutil, "which", lambda name: None)

    assert host.slurm_status("gpu-001") is None


def test_slurm_state_and_reason_from_scontrol(monkeypatch):
    calls = []

    def fake_run(command, **options):
        calls.append(command)
        return subprocess.CompletedProcess(command, 0, stdout=SCONTROL_LINE + "\n", stderr="")

    monkeypatch.setattr(host.shutil, "which", lambda name: "/usr/bin/scontrol")
    monkeypatch.setattr(host.subprocess, "run", fake_run)

    assert host.slurm_status("gpu-001") == {
        "state": "IDLE+DRAIN",
        "reason": "Kill task failed [root@2026-11-29T14:02:11]",
    }
    assert calls == [["scontrol", "show", "node", "gpu-001", "-o"]]


def test_slurm_is_null_when_scontrol_fails(monkeypatch):
    monkeypatch.setattr(host.shutil, "which", lambda name: "/usr/bin/scontrol")
    monkeypatch.setattr(
        host.subprocess,
        "run",
        lambda command, **options: subprocess.CompletedProcess(
            command, 1, stdout="", stderr="Node gpu-001 not found"
        ),
    )

    assert host.slurm_status("gpu-001") is None


def test_boot_id_is_the_kernels():
    with open("/proc/sys/kernel/random/boot_id") as f:
        assert host.boot_id() == f.read().strip()


def test_simulated_boot_id_is_kept_in_the_state_dir(tmp_path):
    first = boot.simulated_boot_id(str(tmp_path))

    assert boot.simulated_boot_id(str(tmp_path)) == first
    (tmp_path / "simulated_boot_id").unlink()  # a simulated reboot
    assert boot.simulated_boot_id(str(tmp_path)) != first


def test_simulated_boot_id_without_a_writable_state_dir(tmp_path):
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")

    assert len(boot.simulated_boot_id(str(blocked / "state"))) == 36


def test_the_node_token_is_stored_for_its_owner_only(tmp_path):
    assert read_node_token(str(tmp_path)) is None

    save_node_token(str(tmp_path), "node-token-1")
    save_node_token(str(tmp_path), "node-token-2")

    assert read_node_token(str(tmp_path)) == "node-token-2"
    assert stat.S_IMODE(os.stat(tmp_path / "node_token").st_mode) == 0o600
    assert sorted(os.listdir(tmp_path)) == ["node_token"]
