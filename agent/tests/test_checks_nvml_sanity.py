"""nvml_sanity against the fake pynvml serving a real H200's readings (ECC on, PCIe
gen 5 x16, no remapped rows), and the faults it must find."""

import pynvml
import pytest

from agent.checks import CheckError, nvml_sanity
from agent.tests.fake_pynvml import FakeNvml


class SanityNvml(FakeNvml):
    """The getters nvml_sanity reads, serving the snapshot's values; tests change them
    per GPU. Max link width: the snapshot has the current width only; `nvidia-smi -q` of
    the same H200 (shared/fixtures/nvml/h200/nvidia-smi-q.txt) reads "Link Width Max :
    16x". Remapped rows as fake_pynvml serves them for the detectors."""

    def __init__(self, **options):
        super().__init__(**options)
        self.ecc_mode = {}  # GPU index -> [current, pending]
        self.max_link = {}  # GPU index -> (generation, width)
        self.remapped_rows = {}  # GPU index -> (correctable, uncorrectable, pending, failure)

    def nvmlDeviceGetEccMode(self, handle):
        self._check(handle, "nvmlDeviceGetEccMode")
        return self.ecc_mode.get(handle.index, list(self.device["ecc_mode"]))

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle):
        self._check(handle, "nvmlDeviceGetMaxPcieLinkGeneration")
        return self.max_link.get(handle.index, (self.device["pcie_max_link_gen"], 16))[0]

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle):
        self._check(handle, "nvmlDeviceGetMaxPcieLinkWidth")
        return self.max_link.get(handle.index, (self.device["pcie_max_link_gen"], 16))[1]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle):
        self._check(handle, "nvmlDeviceGetCurrPcieLinkGeneration")
        return self.device["pcie_link_gen"]

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle):
        self._check(handle, "nvmlDeviceGetCurrPcieLinkWidth")
        return self.device["pcie_link_width"]

    def nvmlDeviceGetRemappedRows(self, handle):
        self._check(handle, "nvmlDeviceGetRemappedRows")
        return self.remapped_rows.get(handle.index, tuple(self.device["remapped_rows"]))


PARAMS = {"expected_gpus": 8, "pcie_gen": 5, "pcie_width": 16}


def inventory_of(fake):
    return [{"index": index, "uuid": fake.uuid(index)} for index in range(fake.gpu_count)]


def check(fake, params=PARAMS, inventory=None):
    measurements = nvml_sanity.measure({"params": {}}, nvml=fake)
    return nvml_sanity.decide(
        measurements,
        nvml_sanity.read_params(params),
        inventory_of(fake) if inventory is None else inventory,
    )


def test_a_healthy_h200_node_passes_with_the_values_read():
    fake = SanityNvml(gpu_count=8)

    result = check(fake)

    assert result["status"] == "passed"
    assert result["message"] == (
        "8 GPUs: ECC on, PCIe max link at least gen 5 x16, no row remapping failure or "
        "pending remap"
    )
    assert result["metrics"]["gpu_count"] == 8
    assert result["metrics"]["gpus"]["GPU-dd6ed4ff-be65-92a6-4ef1-1d9b77bae10b"] == {
        "index": 0,
        "errors": {},
        "name": "NVIDIA H200",
        "ecc_mode_current": True,
        "ecc_mode_pending": True,
        "pcie_max_link_gen": 5,
        "pcie_max_link_width": 16,
        "pcie_link_gen": 5,
        "pcie_link_width": 16,
        "remapped_rows_correctable": 0,
        "remapped_rows_uncorrectable": 0,
        "remap_pending": False,
        "remap_failure": False,
    }


def test_without_pcie_params_the_link_is_read_but_not_judged():
    fake = SanityNvml(gpu_count=2)
    fake.max_link[1] = (3, 4)

    result = check(fake, params={})

    assert result["status"] == "passed"
    assert result["message"] == "2 GPUs: ECC on, no row remapping failure or pending remap"


def test_every_problem_is_listed():
    fake = SanityNvml(gpu_count=8)
    fake.ecc_mode[1] = [pynvml.NVML_FEATURE_DISABLED, pynvml.NVML_FEATURE_DISABLED]
    fake.ecc_mode[2] = [pynvml.NVML_FEATURE_ENABLED, pynvml.NVML_FEATURE_DISABLED]
    fake.max_link[3] = (4, 16)
    fake.max_link[4] = (5, 8)
    fake.remapped_rows[5] = (0, 1, 0, 1)
    fake.remapped_rows[6] = (0, 1, 1, 0)

    result = check(fake)

    assert result["status"] == "failed"
    assert result["message"].split("; ") == [
        f"GPU 1 ({fake.uuid(1)}): ECC is disabled",
        f"GPU 2 ({fake.uuid(2)}): ECC is set to turn off at the next reset",
        f"GPU 3 ({fake.uuid(3)}): PCIe max link generation is gen 4, expected gen 5",
        f"GPU 4 ({fake.uuid(4)}): PCIe max link width is x8, expected x16",
        f"GPU 5 ({fake.uuid(5)}): a row remapping failure occurred",
        f"GPU 6 ({fake.uuid(6)}): a row remap is pending (reset the GPU to apply it)",
    ]
    assert result["metrics"]["gpus"][fake.uuid(5)]["remapped_rows_uncorrectable"] == 1


def test_a_missing_gpu_fails_by_count_and_by_the_agents_inventory():
    fake = SanityNvml(gpu_count=8)
    inventory = inventory_of(fake)
    fake.gpu_count = 7  # GPU 7 fell off the bus since the agent started

    result = check(fake, inventory=inventory)

    assert result["status"] == "failed"
    assert result["message"].split("; ") == [
        "NVML lists 7 GPUs, expected 8",
        f"GPU 7 ({inventory[7]['uuid']}): present when the agent started, now missing",
    ]


def test_a_lost_gpu_cannot_be_read_and_fails():
    fake = SanityNvml(gpu_count=4)
    fake.lost.add(2)

    result = check(fake, params={"expected_gpus": 4})

    assert result["status"] == "failed"
    assert result["message"] == f"GPU 2 ({fake.uuid(2)}): cannot be read: GPU is lost"
    assert result["metrics"]["gpus"]["index:2"] == {"index": 2, "errors": {"uuid": "GPU is lost"}}


def test_a_gpu_without_row_remapping_is_not_judged_on_it_but_ecc_not_supported_is():
    fake = SanityNvml(gpu_count=1, not_supported=("nvmlDeviceGetRemappedRows",))

    remap_unsupported = check(fake, params={})
    fake.not_supported.add("nvmlDeviceGetEccMode")
    ecc_unsupported = check(fake, params={})

    assert remap_unsupported["status"] == "passed"
    gpu = remap_unsupported["metrics"]["gpus"][fake.uuid(0)]
    assert gpu["remap_failure"] is None
    assert gpu["errors"] == {"remapped_rows": "Not Supported"}
    assert ecc_unsupported["status"] == "failed"
    assert ecc_unsupported["message"] == (
        f"GPU 0 ({fake.uuid(0)}): ECC mode cannot be read: Not Supported"
    )


def test_pcie_that_cannot_be_read_fails_only_when_expected():
    fake = SanityNvml(gpu_count=1, not_supported=("nvmlDeviceGetMaxPcieLinkWidth",))

    assert check(fake, params={"pcie_gen": 5})["status"] == "passed"
    result = check(fake, params={"pcie_width": 16})
    assert result["message"] == (
        f"GPU 0 ({fake.uuid(0)}): PCIe max link width cannot be read: Not Supported"
    )


def test_no_gpus_at_all_fails():
    fake = SanityNvml(gpu_count=0)

    assert check(fake, params={})["message"] == "NVML lists no GPUs"


def test_nvml_that_cannot_start_is_an_error():
    fake = SanityNvml(init_error=pynvml.NVMLError_DriverNotLoaded)

    with pytest.raises(CheckError, match="NVML cannot start: Driver Not Loaded"):
        nvml_sanity.measure({"params": {}}, nvml=fake)
