"""The `reset_gpu` command against NVML shaped by the real H200 (fake_pynvml) and a fake
`nvidia-smi` speaking NVIDIA's words: never a real reset. It refuses while a process holds
the GPU and where the topology does not allow one GPU alone (NVIDIA's nvidia-smi manual and
Fabric Manager guide), turns persistence mode off for the reset and back on, and answers
ok once the GPU answers NVML again."""

import json
import sys
from pathlib import Path

import pynvml
import pytest

from agent.tests.fake_pynvml import FakeNvml
from agent.work.commands import CommandFailed
from agent.work.gpu_reset import GpuResetCommand, fabric_manager_running

FAKE_SMI = Path(__file__).parent / "fake_nvidia_smi.py"


@pytest.fixture
def smi(tmp_path, monkeypatch):
    """The fake nvidia-smi's state file: set "in_use", read "calls"."""
    state = tmp_path / "nvidia-smi.json"
    state.write_text("{}")
    monkeypatch.setenv("FAKE_NVIDIA_SMI_STATE", str(state))

    class State:
        def set(self, **values):
            state.write_text(json.dumps(values))

        @property
        def calls(self):
            return json.loads(state.read_text()).get("calls", [])

    return State()


def command(nvml, fabric_manager=lambda: False):
    smi = f"{sys.executable} {FAKE_SMI}"
    return GpuResetCommand(nvml, reset_command=f"{smi} --gpu-reset -i {{index}}",
                           persistence_command=f"{smi} -i {{index}} -pm {{mode}}",
                           answer_timeout_s=2, answer_poll_s=0.05,
                           fabric_manager=fabric_manager)


def test_an_idle_gpu_is_reset_with_persistence_mode_off_for_it(smi):
    nvml = FakeNvml(gpu_count=8)
    uuid = nvml.uuid(3)
    message = command(nvml).reset(uuid)
    assert message.startswith(f"GPU 3 ({uuid}) reset and answers NVML again: GPU "
                              f"00000000:1D:00.0 was successfully reset.")
    # The real H200 runs with persistence mode on (nvml_snapshot.json): off, reset, on.
    assert smi.calls == [["-i", "3", "-pm", "0"], ["--gpu-reset", "-i", "3"],
                         ["-i", "3", "-pm", "1"]]


def test_it_refuses_while_a_process_holds_the_gpu(smi):
    nvml = FakeNvml(gpu_count=8)
    nvml.add_compute_process(2, pid=5123)
    with pytest.raises(CommandFailed, match=r"^busy: pid 5123 holds the GPU$"):
        command(nvml).reset(nvml.uuid(2))
    assert smi.calls == []  # nothing was run


@pytest.mark.parametrize("architecture, links, fabric_manager, refused", [
    # HGX A100: NVLinks to NVSwitches; one GPU alone only through Fabric Manager.
    (pynvml.NVML_DEVICE_ARCH_AMPERE, {0: pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH}, False,
     "refused: the fabric manager needs every GPU reset together"),
    (pynvml.NVML_DEVICE_ARCH_AMPERE, {0: pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH}, True, ""),
    # V100 NVLinked to a peer GPU: every peer must be reset with it.
    (pynvml.NVML_DEVICE_ARCH_VOLTA, {0: pynvml.NVML_NVLINK_DEVICE_TYPE_GPU}, True,
     "refused: on a GPU before Ampere every GPU NVLinked to it must be reset with it"),
    # HGX H100/H200: a GPU may be reset on its own on bare metal.
    (pynvml.NVML_DEVICE_ARCH_HOPPER, {0: pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH}, False, ""),
    # An A100 on PCIe, without NVLink.
    (pynvml.NVML_DEVICE_ARCH_AMPERE, {}, False, ""),
])
def test_the_topology_decides_whether_one_gpu_may_be_reset_alone(smi, architecture, links,
                                                                  fabric_manager, refused):
    nvml = FakeNvml(gpu_count=8)
    nvml.architecture, nvml.nvlinks = architecture, links
    reset = command(nvml, fabric_manager=lambda: fabric_manager)
    if refused:
        with pytest.raises(CommandFailed, match=f"^{refused}"):
            reset.reset(nvml.uuid(1))
        assert smi.calls == []
    else:
        assert "was successfully reset" in reset.reset(nvml.uuid(1))


def test_the_resets_own_error_is_the_answer(smi):
    smi.set(in_use=True)
    nvml = FakeNvml(gpu_count=2)
    with pytest.raises(CommandFailed, match="In use by another client") as failed:
        command(nvml).reset(nvml.uuid(1))
    assert "exited with status 255" in str(failed.value)
    assert smi.calls[-1] == ["-i", "1", "-pm", "1"]  # persistence mode back on all the same


def test_a_gpu_that_does_not_answer_after_the_reset_fails_it(smi):
    nvml = FakeNvml(gpu_count=2)
    reset = command(nvml)
    original = reset._run

    def reset_then_lose(command_text, what):
        output = original(command_text, what)
        if "--gpu-reset" in command_text:
            nvml.lost.add(1)
        return output

    reset._run = reset_then_lose
    with pytest.raises(CommandFailed, match="does not answer NVML within 2 s"):
        reset.reset(nvml.uuid(1))


def test_an_unknown_gpu_is_refused(smi):
    with pytest.raises(CommandFailed, match="no GPU GPU-nope on this node answers NVML"):
        command(FakeNvml()).reset("GPU-nope")


def test_fabric_manager_is_found_by_its_process_name(tmp_path):
    (tmp_path / "41").mkdir()
    (tmp_path / "41" / "comm").write_text("python3\n")
    assert not fabric_manager_running(tmp_path)
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "comm").write_text("nv-fabricmanage\n")
    assert fabric_manager_running(tmp_path)
