"""GPUs that replay a real H200: data/h200/nvml_trace.json is 28 s of one H200 read
every ~0.15 s (idle, then a bf16 matmul load, then cooling down), and
data/h200/nvml_snapshot.json gives its static facts. Each simulated GPU plays the
trace in a loop, in real time, offset in phase so the GPUs differ.

Faults from --inject (agent/sim/inject.py) change what the node shows, on their schedule,
and the same detectors as on a real node find them (agent/detectors, through
make_watchers): a thermal fault sets the HW thermal bit (0x40) and the temperature in
the readings; an Xid writes a real-format NVRM line into `kernel_log`, the simulated
kernel log the Xid watcher reads; an ECC fault raises the GPU's volatile double-bit
count. Only a lost GPU is the backend's own event, as on NVML.

In the demo fleet the GPUs follow the node's jobs (`job`, from agent/sim/workload.py): the
GPUs a job holds replay the trace's loaded seconds, scaled to how hard the job works them,
with its memory in use; the others replay its idle seconds.

The trace has no GPM readings (NVML's activity metrics): each reading's activity fields are
derived from it, the graphics engine as busy as its utilization, the SMs, tensor cores and
DRAM also as hard as its power above idle says (data/h200/gpm_metrics.json's values at
load, which were never captured on hardware)."""

import bisect
import json
import logging
import time
import uuid
import zlib
from importlib import resources

from agent.backends import (
    ACTIVITY_METRICS,
    CLOCK_EVENT_HW_THERMAL,
    cuda_version_text,
    gpu_lost_event,
)
from agent.detectors.xid import load_xid_descriptions
from agent.sim.inject import HYGIENE_FAULTS, XID_STORM_LINES
from agent.sim.kernel_log import SimulatedKernelLog
from agent.work.commands import CommandFailed

log = logging.getLogger(__name__)

# Simulated GPU uuids are uuid5(this namespace, "<node>/<index>"): the same node name
# gets the same GPUs at every start.
_GPU_UUID_NAMESPACE = uuid.UUID("6f1c3d2e-8a4b-5c6d-9e7f-0a1b2c3d4e5f")

# The driver's Xid 154 line names no process (as real ones read); the other codes get
# "pid='<unknown>', name=<unknown>, " and their description from NVIDIA's catalog.
_XID_154_TEXT = "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
# The trace's idle seconds (before its load starts), what counts as its loaded readings, and
# how long the demo fleet's GPUs hold each of those readings.
IDLE_UNTIL_S = 10.0
LOADED_FROM_PCT = 90
LOADED_POWER_SHARE = 0.8  # of the trace's peak: not the seconds while the load ramps up
TRACE_STEP_S = 1.0


def load_fixture(name):
    """A JSON file from agent/data/h200/."""
    path = resources.files("agent") / "data" / "h200" / name
    return json.loads(path.read_text())


def simulated_gpu_uuid(node_name, index):
    return f"GPU-{uuid.uuid5(_GPU_UUID_NAMESPACE, f'{node_name}/{index}')}"


def simulated_gpu_serial(node_name, index):
    """A 13-digit board serial in the real H200's pattern (1654124008485), the same for a
    simulated GPU at every start."""
    number = uuid.uuid5(_GPU_UUID_NAMESPACE, f"serial/{node_name}/{index}").int % 10**8
    return f"16541{number:08d}"


def kernel_pci_address(pci_bus_id):
    """NVML's "00000000:00:0B.0" as an Xid line writes it: "0000:00:0b"."""
    domain, bus, device_function = pci_bus_id.split(":")
    return f"{domain[-4:]}:{bus}:{device_function.split('.')[0]}".lower()


class SimulatedBackend:
    def __init__(self, node_name, gpu_count=8, faults=(), clock=time.monotonic, job=None):
        snapshot = load_fixture("nvml_snapshot.json")
        trace = load_fixture("nvml_trace.json")
        device = snapshot["devices"][0]

        self.driver_version = snapshot["driver_version"]
        self.cuda_version = cuda_version_text(snapshot["cuda_driver_version"])
        self._gpus = [
            {
                "index": index,
                "uuid": simulated_gpu_uuid(node_name, index),
                "name": device["name"],
                "serial": simulated_gpu_serial(node_name, index),
                # The H200 the trace comes from sits at 00000000:00:06.0 (a VM); the
                # simulated ones follow it on the same bus.
                "pci_bus_id": f"00000000:00:{6 + index:02X}.0",
                "memory_total_bytes": device["dynamic"]["memory"]["total"],
            }
            for index in range(gpu_count)
        ]

        samples = trace["samples"]
        self._times = [sample["t"] for sample in samples]
        self._readings = [_reading(sample, device) for sample in samples]
        self._cycle_s = samples[-1]["t"] + trace["interval_s"]
        self._offsets = [index * self._cycle_s / gpu_count for index in range(gpu_count)]
        self._hot_temp_c = device["temp_slowdown_threshold_c"] + 2
        # The job holding the node now (None: idle), and the trace's idle and loaded parts.
        # Nodes of one job differ a little (cooling, clocks, the data each one gets): each
        # has its own share of the job's work and its own place in the trace.
        self._job = job
        node_hash = zlib.crc32(node_name.encode())
        self._node_share = 0.9 + 0.1 * (node_hash % 101) / 100
        self._node_memory = 0.96 + 0.04 * (node_hash // 101 % 101) / 100
        self._node_step = node_hash % 97
        self._idle = [r for t, r in zip(self._times, self._readings) if t < IDLE_UNTIL_S]
        peak_w = max(r["power_w"] for r in self._readings)
        self._power_range_w = (min(r["power_w"] for r in self._readings), peak_w)
        self._activity_at_load = {field: load_fixture("gpm_metrics.json")["at_load"][metric]
                                  for field, metric in ACTIVITY_METRICS.items()}
        self._loaded = [r for r in self._readings if r["util_pct"] >= LOADED_FROM_PCT
                        and r["power_w"] >= LOADED_POWER_SHARE * peak_w]

        self.gpu_count = gpu_count  # as built: lost GPUs included
        self.kernel_log = SimulatedKernelLog()
        self._clock = clock
        self._start = clock()
        # Node hygiene's faults are agent/sim/hygiene.py's, not the GPUs'.
        self._faults = [fault for fault in faults if fault.kind not in HYGIENE_FAULTS]
        self._fired = set()  # indexes of the one-time faults already applied
        self._xid_descriptions = load_xid_descriptions()
        self._lost = set()  # GPU indexes
        self._new_dbe = [0] * gpu_count  # double-bit ECC errors injected, per GPU
        self._events = []
        self.reboots = 0  # simulated reboots so far (node hygiene's simulation reads it)

    def gpus(self):
        self._apply_faults()
        return [dict(gpu) for gpu in self._gpus if gpu["index"] not in self._lost]

    def read_gpus(self):
        elapsed = self._apply_faults()
        job = self._job() if self._job is not None else None
        readings = []
        for gpu in self._gpus:
            index = gpu["index"]
            if index in self._lost:
                continue
            if self._job is None:
                position = (elapsed + self._offsets[index]) % self._cycle_s
                trace_index = bisect.bisect_right(self._times, position) - 1
                reading = {"uuid": gpu["uuid"], **self._readings[trace_index]}
            else:
                reading = {"uuid": gpu["uuid"],
                           **self._job_reading(gpu, job, elapsed + self._offsets[index])}
            if self._thermal_active(index, elapsed):
                reading["clock_event_reasons"] |= CLOCK_EVENT_HW_THERMAL
                reading["temp_c"] = max(reading["temp_c"], self._hot_temp_c)
            reading["ecc_dbe_volatile"] += self._new_dbe[index]
            reading.update(self._activity(reading))
            readings.append(reading)
        return readings

    def take_events(self):
        self._apply_faults()
        events, self._events = self._events, []
        return events

    def wait_ready(self, timeout_s):
        pass

    def reset_gpu(self, uuid):
        """A simulated `nvidia-smi --gpu-reset` of one GPU: its injected double-bit errors
        go, as a reset retires the pages. A GPU off the bus cannot be reset. The `ok`
        message, or CommandFailed."""
        gpu = next((gpu for gpu in self._gpus if gpu["uuid"] == uuid), None)
        if gpu is None or gpu["index"] in self._lost:
            raise CommandFailed(f"no GPU {uuid} on this node answers NVML (simulated)")
        self._new_dbe[gpu["index"]] = 0
        return (f"GPU {gpu['index']} ({uuid}) reset and answers NVML again: GPU "
                f"{gpu['pci_bus_id']} was successfully reset. (simulated)")

    def reboot(self):
        """As after a real reboot: the injected faults are gone (a lost GPU is back, the
        volatile ECC counts and a thermal slowdown reset), and the trace starts over."""
        self._faults = []
        self._fired = set()
        self._lost = set()
        self._new_dbe = [0] * len(self._gpus)
        self._events = []
        self._start = self._clock()
        self.reboots += 1

    def close(self):
        pass

    def _job_reading(self, gpu, job, position):
        """The GPU's reading with `job` on the node: loaded when the job holds it (the
        first gpus_per_node GPUs), scaled to its intensity, with its memory; else idle."""
        step = int(position / TRACE_STEP_S) + self._node_step
        if job is None or gpu["index"] >= job.gpus_per_node:
            return self._idle[step % len(self._idle)]
        idle, loaded = self._idle[0], self._loaded[step % len(self._loaded)]
        # Each GPU of a job works a little differently: its own share of the intensity.
        share = job.intensity * self._node_share * (
            0.92 + 0.08 * ((gpu["index"] * 37 + step) % 11) / 10)

        def between(key):
            return idle[key] + (loaded[key] - idle[key]) * share

        return {**loaded,
                "util_pct": round(min(100, loaded["util_pct"] * share)),
                "mem_util_pct": round(between("mem_util_pct")),
                "mem_used_bytes": int(gpu["memory_total_bytes"] * job.memory_fraction
                                      * self._node_memory),
                "temp_c": round(between("temp_c")),
                "power_w": round(between("power_w"), 1)}

    def _activity(self, reading):
        """The reading's GPM activity fields, derived from its utilization and power."""
        idle_w, peak_w = self._power_range_w
        busy = reading["util_pct"] / 100
        working = min(1.0, max(0.0, (reading["power_w"] - idle_w) / (peak_w - idle_w)))
        return {field: round(at_load * busy * (1.0 if field == "gr_engine_active_pct"
                                               else working), 1)
                for field, at_load in self._activity_at_load.items()}

    def _thermal_active(self, index, elapsed):
        return any(
            fault.kind == "thermal" and fault.gpu == index and _within(fault, elapsed)
            for fault in self._faults
        )

    def _apply_faults(self):
        """Apply the one-time faults whose time has come; returns the seconds since start."""
        elapsed = self._clock() - self._start
        for number, fault in enumerate(self._faults):
            if fault.kind == "thermal":
                self._note_thermal(number, fault, elapsed)
                continue
            if elapsed < fault.at_s or number in self._fired:
                continue
            self._fired.add(number)
            log.warning("injected %s on GPU %d", fault.label, fault.gpu)
            gpu = self._gpus[fault.gpu]
            if fault.kind == "xid":
                self.kernel_log.write(self._xid_line(fault.xid, gpu))
            elif fault.kind == "xid_storm":
                line = self._xid_line(fault.xid, gpu)
                for _ in range(XID_STORM_LINES):
                    self.kernel_log.write(line)
            elif fault.kind == "ecc_dbe":
                self._new_dbe[fault.gpu] += 1
            elif fault.kind == "gpu_lost":
                self._lost.add(fault.gpu)
                self._events.append(gpu_lost_event(gpu["uuid"], source="simulated"))
        return elapsed

    def _note_thermal(self, number, fault, elapsed):
        """Log when an injected thermal slowdown starts and ends (what tests time against)."""
        if _within(fault, elapsed) and (number, "started") not in self._fired:
            self._fired.add((number, "started"))
            log.warning("injected thermal on GPU %d", fault.gpu)
        elif elapsed >= fault.at_s + (fault.duration_s or float("inf")) and (
                number, "ended") not in self._fired:
            self._fired.add((number, "ended"))
            log.warning("injected thermal on GPU %d ended", fault.gpu)

    def _xid_line(self, code, gpu):
        """The line the NVIDIA driver writes for this Xid, as on a real node."""
        prefix = f"NVRM: Xid (PCI:{kernel_pci_address(gpu['pci_bus_id'])}): {code}, "
        if code == 154:
            return prefix + _XID_154_TEXT
        description = self._xid_descriptions.get(code, f"Xid {code}")
        return prefix + f"pid='<unknown>', name=<unknown>, {description}."


def _within(fault, elapsed):
    """The fault holds at this moment (thermal: from its start for its duration)."""
    end = float("inf") if fault.duration_s is None else fault.at_s + fault.duration_s
    return fault.at_s <= elapsed < end


def _reading(sample, device):
    """One trace sample as a sample's GPU entry (without the uuid)."""
    return {
        "util_pct": sample["utilization"]["gpu"],
        "mem_util_pct": sample["utilization"]["memory"],
        "mem_used_bytes": sample["memory"]["used"],
        "temp_c": sample["temperature_c"],
        "power_w": sample["power_mw"] / 1000,
        "sm_clock_mhz": sample["sm_clock_mhz"],
        "clock_event_reasons": sample["clock_event_reasons"],
        "ecc_dbe_volatile": device["ecc_uncorrected_volatile"],
        "pcie_tx_bps": sample["pcie_tx_kbps"] * 1024,
        "pcie_rx_bps": sample["pcie_rx_kbps"] * 1024,
    }
