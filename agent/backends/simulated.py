"""GPUs that replay a real H200: fixtures/h200/nvml_trace.json is 28 s of one H200 read
every ~0.15 s (idle, then a bf16 matmul load, then cooling down), and
fixtures/h200/nvml_snapshot.json gives its static facts. Each simulated GPU plays the
trace in a loop, in real time, offset in phase so the GPUs differ. Faults from --inject
(agent/inject.py) are applied on their schedule."""

import bisect
import json
import time
import uuid
from importlib import resources

from agent.backends import (
    CLOCK_EVENT_HW_THERMAL,
    cuda_version_text,
    gpu_lost_event,
)
from agent.protocol import event_frame

THERMAL_HOLD_S = 10.0  # how long HW thermal slowdown lasts before it is an event

# Simulated GPU uuids are uuid5(this namespace, "<node>/<index>"): the same node name
# gets the same GPUs at every start.
_GPU_UUID_NAMESPACE = uuid.UUID("6f1c3d2e-8a4b-5c6d-9e7f-0a1b2c3d4e5f")


def load_fixture(name):
    """A JSON file from agent/fixtures/h200/."""
    path = resources.files("agent") / "fixtures" / "h200" / name
    return json.loads(path.read_text())


def load_xid_descriptions():
    """{code: description} from agent/fixtures/xid_catalog.tsv (NVIDIA's Xid catalog)."""
    lines = (resources.files("agent") / "fixtures" / "xid_catalog.tsv").read_text().splitlines()
    header = lines[0].split("\t")
    code_column, description_column = header.index("code"), header.index("description")
    descriptions = {}
    for line in lines[1:]:
        columns = line.split("\t")
        descriptions[int(columns[code_column])] = columns[description_column]
    return descriptions


def simulated_gpu_uuid(node_name, index):
    return f"GPU-{uuid.uuid5(_GPU_UUID_NAMESPACE, f'{node_name}/{index}')}"


class SimulatedBackend:
    def __init__(
        self, node_name, gpu_count=8, faults=(), clock=time.monotonic, thermal_hold_s=THERMAL_HOLD_S
    ):
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

        self._clock = clock
        self._start = clock()
        self._thermal_hold_s = thermal_hold_s
        self._faults = list(faults)
        self._fired = set()  # (fault index, what): "event", "warned", "cleared"
        self._xid_descriptions = load_xid_descriptions()
        self._lost = set()  # GPU indexes
        self._events = []

    def gpus(self):
        self._apply_faults()
        return [dict(gpu) for gpu in self._gpus if gpu["index"] not in self._lost]

    def read_gpus(self):
        elapsed = self._apply_faults()
        readings = []
        for gpu in self._gpus:
            index = gpu["index"]
            if index in self._lost:
                continue
            position = (elapsed + self._offsets[index]) % self._cycle_s
            trace_index = bisect.bisect_right(self._times, position) - 1
            reading = {"uuid": gpu["uuid"], **self._readings[trace_index]}
            if self._thermal_active(index, elapsed):
                reading["clock_event_reasons"] |= CLOCK_EVENT_HW_THERMAL
                reading["temp_c"] = max(reading["temp_c"], self._hot_temp_c)
            readings.append(reading)
        return readings

    def take_events(self):
        self._apply_faults()
        events, self._events = self._events, []
        return events

    def wait_ready(self, timeout_s):
        pass

    def close(self):
        pass

    def _thermal_active(self, index, elapsed):
        return any(
            fault.kind == "thermal" and fault.gpu == index and _within(fault, elapsed)
            for fault in self._faults
        )

    def _apply_faults(self):
        """Fire the events whose time has come; returns the seconds since start."""
        elapsed = self._clock() - self._start
        for number, fault in enumerate(self._faults):
            if elapsed < fault.at_s:
                continue
            gpu_uuid = self._gpus[fault.gpu]["uuid"]
            if fault.kind == "xid" and self._first(number, "event"):
                self._events.append(self._xid_event(fault.xid, gpu_uuid))
            elif fault.kind == "gpu_lost" and self._first(number, "event"):
                self._lost.add(fault.gpu)
                self._events.append(gpu_lost_event(gpu_uuid, source="simulated"))
            elif fault.kind == "thermal":
                self._thermal_events(number, fault, gpu_uuid, elapsed)
        return elapsed

    def _thermal_events(self, number, fault, gpu_uuid, elapsed):
        held_long_enough = fault.duration_s is None or fault.duration_s > self._thermal_hold_s
        if (
            held_long_enough
            and elapsed >= fault.at_s + self._thermal_hold_s
            and self._first(number, "warned")
        ):
            self._events.append(
                event_frame(
                    signature="thermal_throttle",
                    severity="warning",
                    message=f"HW thermal slowdown held for {self._thermal_hold_s:g} s",
                    gpu_uuid=gpu_uuid,
                    detail={"clock_event_reasons": CLOCK_EVENT_HW_THERMAL, "source": "simulated"},
                )
            )
        if (
            (number, "warned") in self._fired
            and not _within(fault, elapsed)
            and self._first(number, "cleared")
        ):
            self._events.append(
                event_frame(
                    signature="thermal_throttle",
                    severity="info",
                    message="HW thermal slowdown ended",
                    gpu_uuid=gpu_uuid,
                    detail={"source": "simulated"},
                    state="cleared",
                )
            )

    def _first(self, number, what):
        """True the first time it is asked for this fault and this step."""
        if (number, what) in self._fired:
            return False
        self._fired.add((number, what))
        return True

    def _xid_event(self, code, gpu_uuid):
        return event_frame(
            signature=f"xid:{code}",
            severity="critical",
            message=self._xid_descriptions.get(code, f"Xid {code}"),
            gpu_uuid=gpu_uuid,
            detail={"xid": code, "source": "simulated"},
        )


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
