"""A stand-in for the pynvml module that serves the real H200's readings.

Static facts come from agent/data/h200/nvml_snapshot.json (one real H200);
dynamic ones from a block in the snapshot's `dynamic` format (the snapshot's own idle
block, or one sample of nvml_trace.json). Exception classes, constants and the ctypes
structures returned are the real nvidia-ml-py ones, which import without a driver.

For the detectors it also serves, as the real H200 did: remapped rows (the snapshot's
`remapped_rows`: none, none pending, no failure), the GPU recovery action field (NONE:
`nvidia-smi -q` on that H200 reads "GPU Recovery Action : None"), and an Xid event set
(registering for Xid events worked there; a 100 ms wait timed out). Tests change them
through `remapped_rows`, `recovery_action` and raise_xid().

For the job-end cleanup it serves each GPU's minor number (the index: the real H200's
`nvidia-smi -q` reads "Minor Number : 0" for its GPU 0; the minors of further fake GPUs
were never captured) and its compute processes, none by default (the snapshot's
"processes": []). A process is shaped as the one that H200's `nvidia-smi -q -x` listed
(shared/fixtures/nvml/h200/nvidia-smi-q.xml: pid 424, python3, 1002 MiB,
gpu_instance_id and compute_instance_id N/A) and returned as pynvml returns it: a
c_nvmlProcessInfo_v3_t turned into an nvmlFriendlyObject, N/A ids as 0xFFFFFFFF (NVML's
"not MIG") and an unknown usedGpuMemory as None. Tests set them with
add_compute_process() or `compute_processes[index]`."""

import ctypes
import json
import queue
import time
from pathlib import Path
from types import SimpleNamespace

import pynvml

FIXTURES = Path(__file__).resolve().parent.parent / "data" / "h200"

# The real H200's one compute process used 1002 MiB (nvidia-smi-q.xml).
H200_PROCESS_USED_BYTES = 1002 * 2**20


def load_snapshot():
    return json.loads((FIXTURES / "nvml_snapshot.json").read_text())


def load_gpm():
    """agent/data/h200/gpm_metrics.json: GPM values shaped by NVML's documentation, never
    captured on hardware (the file says so)."""
    return json.loads((FIXTURES / "gpm_metrics.json").read_text())


def load_trace():
    return json.loads((FIXTURES / "nvml_trace.json").read_text())


def trace_load_sample():
    """A sample from the middle of the trace's bf16 matmul load (t about 15 s)."""
    return next(sample for sample in load_trace()["samples"] if sample["t"] >= 15.0)


class FakeHandle:
    def __init__(self, index):
        self.index = index

    @property
    def _as_parameter_(self):
        # Where a real handle would point, so ctypes.cast(handle, c_void_p) works.
        return ctypes.c_void_p(0x1000 + self.index)


class FakeEventSet:
    def __init__(self):
        self.registered = {}  # GPU index -> event types
        self.pending = queue.SimpleQueue()  # event data, as nvmlEventSetWait_v2 returns it
        self.freed = False


class FakeNvml:
    def __init__(
        self,
        dynamic=None,
        gpu_count=1,
        pcie_delay_s=0.0,
        not_supported=(),
        init_error=None,
    ):
        """dynamic: readings in the snapshot's `dynamic` format (default: the snapshot's
        idle block); gpu_count: copies of the real H200 (GPU 0 is the real one, the
        others get their own uuid and bus id); pcie_delay_s: how long
        nvmlDeviceGetPcieThroughput blocks; not_supported: getter names that raise
        NVMLError_NotSupported; init_error: an NVMLError class nvmlInit raises."""
        for name in dir(pynvml):
            if name.startswith(("NVMLError", "NVML_", "nvmlEventType", "c_nvmlGpm")):
                setattr(self, name, getattr(pynvml, name))
        self.snapshot = load_snapshot()
        self.device = self.snapshot["devices"][0]
        self.dynamic = dynamic if dynamic is not None else self.device["dynamic"]
        self.gpu_count = gpu_count
        self.pcie_delay_s = pcie_delay_s
        self.not_supported = set(not_supported)
        self.init_error = init_error
        self.lost = set()  # indexes of GPUs that answer NVMLError_GpuIsLost
        self.pcie_calls = 0
        self.remapped_rows = {}  # GPU index -> (corrected, uncorrectable, pending, failure)
        self.recovery_action = {}  # GPU index -> an NVML_GPU_RECOVERY_ACTION_* value
        self.event_sets = []
        self.compute_processes = {}  # GPU index -> [c_nvmlProcessInfo_v3_t]
        # The topology of a GPU reset: the real H200 (a VM) has no NVLink ("Not Supported"
        # for each link, nvml_snapshot.json) and is a Hopper (arch 9). Other systems' were
        # never captured on real hardware: tests set `architecture` and `nvlinks` {link:
        # remote NVML_NVLINK_DEVICE_TYPE_*} as NVML documents them.
        self.architecture = self.device["arch"]
        self.nvlinks = {}
        self.persistence_mode = self.device["persistence_mode"]
        # GPM (Hopper and later), as NVML's API documentation describes it: a sample is a
        # buffer NVML allocates; nvmlGpmMetricsGet computes each metric over two samples of
        # one GPU. The values were never captured on hardware (gpm_metrics.json): they
        # move from its `idle` to its `at_load` with the GPU's utilization.
        self.gpm = load_gpm()
        self.gpm_samples = {}  # address -> [buffer, (GPU index, {metric name: value}) or None]

    def uuid(self, index):
        real = self.device["uuid"]
        return real if index == 0 else f"{real[:-2]}{index:02x}"

    def _check(self, handle, getter):
        if handle.index in self.lost:
            raise pynvml.NVMLError_GpuIsLost()
        if getter in self.not_supported:
            raise pynvml.NVMLError_NotSupported()

    # System

    def nvmlInit(self):
        if self.init_error is not None:
            raise self.init_error()

    def nvmlShutdown(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        return self.snapshot["driver_version"]

    def nvmlSystemGetCudaDriverVersion(self):
        return self.snapshot["cuda_driver_version"]

    def nvmlDeviceGetCount(self):
        return self.gpu_count

    def nvmlDeviceGetHandleByIndex(self, index):
        if not 0 <= index < self.gpu_count:
            raise pynvml.NVMLError_InvalidArgument()
        return FakeHandle(index)

    # Static facts

    def nvmlDeviceGetUUID(self, handle):
        self._check(handle, "nvmlDeviceGetUUID")
        return self.uuid(handle.index)

    def nvmlDeviceGetHandleByUUID(self, uuid):
        for index in range(self.gpu_count):
            if self.uuid(index) == uuid:
                if index in self.lost:
                    raise pynvml.NVMLError_GpuIsLost()
                return FakeHandle(index)
        raise pynvml.NVMLError_NotFound()

    def nvmlDeviceGetIndex(self, handle):
        self._check(handle, "nvmlDeviceGetIndex")
        return handle.index

    def nvmlDeviceGetArchitecture(self, handle):
        self._check(handle, "nvmlDeviceGetArchitecture")
        return self.architecture

    def nvmlDeviceGetNvLinkState(self, handle, link):
        self._check(handle, "nvmlDeviceGetNvLinkState")
        if link not in self.nvlinks:
            raise pynvml.NVMLError_NotSupported()
        return pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle, link):
        self._check(handle, "nvmlDeviceGetNvLinkRemoteDeviceType")
        if link not in self.nvlinks:
            raise pynvml.NVMLError_NotSupported()
        return self.nvlinks[link]

    def nvmlDeviceGetPersistenceMode(self, handle):
        self._check(handle, "nvmlDeviceGetPersistenceMode")
        return self.persistence_mode

    def nvmlDeviceGetSerial(self, handle):
        # GPU 0's is the real H200's (nvidia-smi -q: "Serial Number : 1654124008485"); the
        # serials of further fake GPUs were never captured and only follow its pattern.
        self._check(handle, "nvmlDeviceGetSerial")
        real = self.device["serial"]
        return real if handle.index == 0 else f"{real[:-2]}{handle.index:02d}"

    def nvmlDeviceGetName(self, handle):
        self._check(handle, "nvmlDeviceGetName")
        return self.device["name"]

    def nvmlDeviceGetPciInfo(self, handle):
        self._check(handle, "nvmlDeviceGetPciInfo")
        pci = self.device["pci"]
        info = pynvml.nvmlPciInfo_t()
        info.domain = pci["domain"]
        info.bus = pci["bus"]
        info.device = pci["device"] + handle.index
        info.pciDeviceId = pci["pciDeviceId"]
        info.pciSubSystemId = pci["pciSubSystemId"]
        bus_id = pci["busId"] if handle.index == 0 else f"00000000:00:{6 + handle.index:02X}.0"
        info.busId = bus_id.encode()
        return info

    # Readings

    def nvmlDeviceGetMemoryInfo(self, handle):
        self._check(handle, "nvmlDeviceGetMemoryInfo")
        memory = self.dynamic["memory"]
        return pynvml.c_nvmlMemory_t(
            total=memory["total"], free=memory["free"], used=memory["used"]
        )

    def nvmlDeviceGetUtilizationRates(self, handle):
        self._check(handle, "nvmlDeviceGetUtilizationRates")
        utilization = self.dynamic["utilization"]
        return pynvml.c_nvmlUtilization_t(gpu=utilization["gpu"], memory=utilization["memory"])

    def nvmlDeviceGetTemperature(self, handle, sensor):
        self._check(handle, "nvmlDeviceGetTemperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError_InvalidArgument()
        return self.dynamic["temperature_c"]

    def nvmlDeviceGetPowerUsage(self, handle):
        self._check(handle, "nvmlDeviceGetPowerUsage")
        return self.dynamic["power_mw"]

    def nvmlDeviceGetClockInfo(self, handle, clock_type):
        self._check(handle, "nvmlDeviceGetClockInfo")
        if clock_type == pynvml.NVML_CLOCK_SM:
            return self.dynamic["sm_clock_mhz"]
        if clock_type == pynvml.NVML_CLOCK_MEM:
            return self.dynamic["mem_clock_mhz"]
        raise pynvml.NVMLError_InvalidArgument()

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        self._check(handle, "nvmlDeviceGetCurrentClocksEventReasons")
        return self.dynamic["clock_event_reasons"]

    def nvmlDeviceGetTotalEccErrors(self, handle, error_type, counter_type):
        self._check(handle, "nvmlDeviceGetTotalEccErrors")
        counters = {
            (
                pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                pynvml.NVML_VOLATILE_ECC,
            ): "ecc_corrected_volatile",
            (
                pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                pynvml.NVML_VOLATILE_ECC,
            ): "ecc_uncorrected_volatile",
            (
                pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                pynvml.NVML_AGGREGATE_ECC,
            ): "ecc_uncorrected_aggregate",
        }
        if (error_type, counter_type) not in counters:
            raise pynvml.NVMLError_InvalidArgument()
        return self.device[counters[(error_type, counter_type)]]

    def nvmlDeviceGetPcieThroughput(self, handle, counter):
        self.pcie_calls += 1
        time.sleep(self.pcie_delay_s)  # a real H200 blocks about 21 ms here
        self._check(handle, "nvmlDeviceGetPcieThroughput")
        if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES:
            return self.dynamic["pcie_tx_kbps"]
        if counter == pynvml.NVML_PCIE_UTIL_RX_BYTES:
            return self.dynamic["pcie_rx_kbps"]
        raise pynvml.NVMLError_InvalidArgument()

    def nvmlDeviceGetMinorNumber(self, handle):
        self._check(handle, "nvmlDeviceGetMinorNumber")
        return handle.index

    # Job-end cleanup: compute processes

    def add_compute_process(self, index, pid, used_bytes=H200_PROCESS_USED_BYTES):
        """Process `pid` holds `used_bytes` (None: NVML cannot say) on GPU `index`."""
        not_available = pynvml.NVML_VALUE_NOT_AVAILABLE_uint.value
        info = pynvml.c_nvmlProcessInfo_v3_t(
            pid=pid,
            usedGpuMemory=(pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
                           if used_bytes is None else used_bytes),
            gpuInstanceId=not_available,
            computeInstanceId=not_available,
        )
        self.compute_processes.setdefault(index, []).append(info)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        self._check(handle, "nvmlDeviceGetComputeRunningProcesses")
        processes = []
        for info in self.compute_processes.get(handle.index, []):
            # What pynvml's nvmlDeviceGetComputeRunningProcesses_v3 does with each struct.
            process = pynvml.nvmlStructToFriendlyObject(info)
            if process.usedGpuMemory == pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value:
                process.usedGpuMemory = None
            processes.append(process)
        return processes

    # Detectors: remapped rows, field values, event sets

    def nvmlDeviceGetRemappedRows(self, handle):
        self._check(handle, "nvmlDeviceGetRemappedRows")
        return self.remapped_rows.get(handle.index, tuple(self.device["remapped_rows"]))

    def nvmlDeviceGetFieldValues(self, handle, field_ids):
        self._check(handle, "nvmlDeviceGetFieldValues")
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for value, field_id in zip(values, field_ids):
            value.fieldId = field_id
            if field_id == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
                value.nvmlReturn = pynvml.NVML_SUCCESS
                value.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                value.value.uiVal = self.recovery_action.get(
                    handle.index, pynvml.NVML_GPU_RECOVERY_ACTION_NONE
                )
            else:
                value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlGpmQueryDeviceSupport(self, handle):
        self._check(handle, "nvmlGpmQueryDeviceSupport")
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(self.architecture >= pynvml.NVML_DEVICE_ARCH_HOPPER)
        return support

    def nvmlGpmSampleAlloc(self):
        buffer = ctypes.c_uint64()
        sample = ctypes.cast(ctypes.pointer(buffer), pynvml.c_nvmlGpmSample_t)
        self.gpm_samples[ctypes.addressof(buffer)] = [buffer, None]
        return sample

    def nvmlGpmSampleFree(self, sample):
        self._gpm_sample(sample)
        del self.gpm_samples[ctypes.cast(sample, ctypes.c_void_p).value]

    def nvmlGpmSampleGet(self, handle, sample):
        self._check(handle, "nvmlGpmSampleGet")
        load = self.dynamic["utilization"]["gpu"] / 100
        idle, at_load = self.gpm["idle"], self.gpm["at_load"]
        values = {name: idle[name] + (at_load[name] - idle[name]) * load for name in idle}
        self._gpm_sample(sample)[1] = (handle.index, values)
        return sample

    def nvmlGpmMetricsGet(self, request):
        if request.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        first, second = self._gpm_sample(request.sample1)[1], self._gpm_sample(request.sample2)[1]
        if first is None or second is None or first[0] != second[0]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        names = {getattr(pynvml, name): name for name in self.gpm["idle"]}
        for metric in request.metrics[:request.numMetrics]:
            name = names.get(metric.metricId)
            if name is None:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            metric.nvmlReturn = pynvml.NVML_SUCCESS
            metric.value = (first[1][name] + second[1][name]) / 2  # the mean over the interval
        return request

    def _gpm_sample(self, sample):
        entry = self.gpm_samples.get(ctypes.cast(sample, ctypes.c_void_p).value)
        if entry is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return entry

    def nvmlEventSetCreate(self):
        event_set = FakeEventSet()
        self.event_sets.append(event_set)
        return event_set

    def nvmlDeviceRegisterEvents(self, handle, event_types, event_set):
        self._check(handle, "nvmlDeviceRegisterEvents")
        event_set.registered[handle.index] = event_types

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        try:
            data = event_set.pending.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise pynvml.NVMLError_Timeout() from None
        if isinstance(data, Exception):
            raise data
        return data

    def nvmlEventSetFree(self, event_set):
        event_set.freed = True

    def raise_xid(self, index, code):
        """The driver reports Xid `code` on GPU `index`: every event set registered for
        Xid events on it gets the event, with a new handle object for the device (as
        NVML's event data holds another pointer to the same device)."""
        for event_set in self.event_sets:
            if event_set.registered.get(index, 0) & pynvml.nvmlEventTypeXidCriticalError:
                event_set.pending.put(
                    SimpleNamespace(
                        device=FakeHandle(index),
                        eventType=pynvml.nvmlEventTypeXidCriticalError,
                        eventData=code,
                    )
                )

    def fail_event_wait(self, error):
        """The next wait on every event set raises `error` (an NVMLError)."""
        for event_set in self.event_sets:
            event_set.pending.put(error)
