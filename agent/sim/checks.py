"""SimulatedCheckRunner: the checks of a --simulate node (the demo), with no GPU.

Same checks, params and verdicts as CheckRunner (the same read_params and decide), but
the measurements are made up from real ones, with a little jitter seeded by the node's
GPUs, and the metrics say "simulated": true:

- gpu_compute: 788 TFLOP/s per GPU, and gpu_memory_bandwidth: 4.3 TB/s (an H200
  through PyTorch: bf16 8192^3 products, a 4 GiB device-to-device copy), within 2%;
- nvml_sanity: the readings of a real H200 (agent/data/h200/nvml_snapshot.json);
- storage: a real disk's figures (STORAGE_WRITE_MBPS, STORAGE_READ_MBPS), within 5%;
  nothing is written;
- nccl: the error of a node without nccl-tests.

The simulated backend's faults show where a real node would show them: a lost GPU is
missing from every GPU check (and fails it), and a GPU in HW thermal slowdown (clock
event reason 0x40) runs its compute and copies at half speed, as its clocks are cut."""

import asyncio
import random

from agent.backends import CLOCK_EVENT_HW_THERMAL
from agent.checks import CHECKS, CheckError, error
from agent.checks.gpu_memory_bandwidth import DEFAULT_BYTES
from agent.checks.nccl import NOT_INSTALLED
from agent.checks.runner import prepare
from agent.sim.backend import load_fixture

H200_BF16_TFLOPS = 788.0
H200_COPY_TBPS = 4.3
GPU_JITTER = 0.02
HW_SLOWDOWN_FACTOR = 0.5
# nvidia-smi -q of the H200 the snapshot comes from: "Link Width Max : 16x"
# (shared/fixtures/nvml/h200/nvidia-smi-q.txt); the snapshot has the current width only.
H200_PCIE_MAX_LINK_WIDTH = 16
# This storage check on the development VM's virtio disk (1 GiB in /tmp, 2026-11-29):
# the medians of 8 runs; single runs ranged 334-1469 MB/s write, 935-2135 MB/s read.
STORAGE_WRITE_MBPS = 1260.0
STORAGE_READ_MBPS = 1535.0
STORAGE_JITTER = 0.05


class SimulatedCheckRunner:
    def __init__(self, backend, scratch_dir=None, *, duration_s=2.0, seed=None):
        """backend: a SimulatedBackend. duration_s: how long a check seems to run."""
        self._backend = backend
        self._inventory = [dict(gpu) for gpu in backend.gpus()]
        self._scratch_dir = str(scratch_dir) if scratch_dir is not None else None
        self._duration_s = duration_s
        if seed is None:
            seed = ",".join(gpu["uuid"] for gpu in self._inventory)
        self._rng = random.Random(seed)
        self._lock = asyncio.Lock()
        self._measure = {
            "gpu_compute": self._gpu_compute,
            "gpu_memory_bandwidth": self._gpu_memory_bandwidth,
            "nvml_sanity": self._nvml_sanity,
            "storage": self._storage,
            "nccl": self._nccl,
        }

    @property
    def check_names(self):
        return sorted(CHECKS)

    async def run(self, check, params):
        try:
            module, values = prepare(CHECKS, check, params)
        except CheckError as exc:
            return error(str(exc))
        async with self._lock:
            await asyncio.sleep(self._duration_s)
            try:
                measurements = self._measure[check](values)
            except CheckError as exc:
                return error(str(exc), {"simulated": True})
        result = module.decide(measurements, values, self._inventory)
        result["metrics"]["simulated"] = True
        return result

    def _gpus_now(self):
        """The GPUs the backend still has: [(hello entry, in HW thermal slowdown)]."""
        slowed = {
            reading["uuid"]
            for reading in self._backend.read_gpus()
            if reading["clock_event_reasons"] & CLOCK_EVENT_HW_THERMAL
        }
        return [(gpu, gpu["uuid"] in slowed) for gpu in self._backend.gpus()]

    def _jitter(self, spread):
        return 1 + self._rng.uniform(-spread, spread)

    def _gpu_compute(self, params):
        gpus = []
        for gpu, slowed in self._gpus_now():
            tflops = H200_BF16_TFLOPS * self._jitter(GPU_JITTER)
            if slowed:
                tflops *= HW_SLOWDOWN_FACTOR
            gpus.append({**_identity(gpu), "tflops": round(tflops, 1)})
        return {"backend": "torch", "size": params["size"], "gpus": gpus}

    def _gpu_memory_bandwidth(self, params):
        gpus = []
        for gpu, slowed in self._gpus_now():
            tbps = H200_COPY_TBPS * self._jitter(GPU_JITTER)
            if slowed:
                tbps *= HW_SLOWDOWN_FACTOR
            gpus.append({**_identity(gpu), "tbps": round(tbps, 3)})
        return {"backend": "torch", "bytes": params["bytes"] or DEFAULT_BYTES, "gpus": gpus}

    def _nvml_sanity(self, params):
        device = load_fixture("nvml_snapshot.json")["devices"][0]
        ecc_current, ecc_pending = device["ecc_mode"]
        corrected, uncorrected, pending, failure = device["remapped_rows"]
        gpus = [
            {
                "index": gpu["index"],
                "errors": {},
                "uuid": gpu["uuid"],
                "name": gpu["name"],
                "ecc_mode_current": ecc_current == 1,
                "ecc_mode_pending": ecc_pending == 1,
                "pcie_max_link_gen": device["pcie_max_link_gen"],
                "pcie_max_link_width": H200_PCIE_MAX_LINK_WIDTH,
                "pcie_link_gen": device["pcie_link_gen"],
                "pcie_link_width": device["pcie_link_width"],
                "remapped_rows_correctable": corrected,
                "remapped_rows_uncorrectable": uncorrected,
                "remap_pending": bool(pending),
                "remap_failure": bool(failure),
            }
            for gpu in self._backend.gpus()
        ]
        return {"gpu_count": len(gpus), "gpus": gpus}

    def _storage(self, params):
        return {
            "path": params["path"] or self._scratch_dir,
            "bytes": params["bytes"],
            "write_mbps": round(STORAGE_WRITE_MBPS * self._jitter(STORAGE_JITTER), 1),
            "read_mbps": round(STORAGE_READ_MBPS * self._jitter(STORAGE_JITTER), 1),
            "page_cache_dropped": True,
        }

    def _nccl(self, params):
        raise CheckError(f"{NOT_INSTALLED} (a simulated node)")


def _identity(gpu):
    """What a compute check's child reports of a GPU, besides its figure."""
    return {"index": gpu["index"], "uuid": gpu["uuid"], "name": gpu["name"]}
