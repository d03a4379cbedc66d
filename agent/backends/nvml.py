"""The real GPUs, read through NVML (nvidia-ml-py, imported as pynvml).

Measured on an H200 (data/h200/nvml_snapshot.json, `latency`): each getter used
for a sample takes 2-7 us, but nvmlDeviceGetPcieThroughput blocks about 21 ms per
call (NVML measures over a 20 ms window). So PCIe throughput is read by a background
thread on its own slower cadence, and a sample takes the latest value it found: a
sample of 8 GPUs never waits on it.

On Hopper and later, NVML's GPM metrics say how busy the GPU's parts really are (SM
activity, occupancy, tensor cores, DRAM): each sample takes a GPM sample per GPU and NVML
computes the metrics over the time since the previous one (GpmReader)."""

import logging
import threading

from agent.backends import (
    ACTIVITY_FIELDS,
    ACTIVITY_METRICS,
    BackendUnavailable,
    cuda_version_text,
    gpu_lost_event,
)

log = logging.getLogger(__name__)

PCIE_INTERVAL_S = 5.0


class NvmlBackend:
    def __init__(self, nvml=None, pcie_interval_s=PCIE_INTERVAL_S):
        """nvml: the pynvml module, or a stand-in with the same names (tests)."""
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError as exc:
                raise BackendUnavailable(
                    "the nvidia-ml-py package is not installed (pip install -r "
                    "agent/requirements.txt)"
                ) from exc
        self._nvml = nvml
        _init_nvml(nvml)

        try:
            self.driver_version = _text(nvml.nvmlSystemGetDriverVersion())
            gpu_count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            raise BackendUnavailable(f"NVML started but cannot list the GPUs: {exc}") from exc
        try:
            self.cuda_version = cuda_version_text(nvml.nvmlSystemGetCudaDriverVersion())
        except nvml.NVMLError as exc:
            log.warning("NVML does not give the CUDA driver version: %s", exc)
            self.cuda_version = None

        self._gpus = []  # [(hello entry, NVML handle)]
        self._gpm = {}  # uuid -> GpmReader
        for index in range(gpu_count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                gpu = _describe_gpu(nvml, index, handle)
                self._gpus.append((gpu, handle))
                self._gpm[gpu["uuid"]] = GpmReader(nvml, handle)
            except nvml.NVMLError as exc:
                # The server sees it missing against the node's inventory (gpu_lost).
                log.error("GPU %d cannot be read (%s); it is left out", index, exc)

        self._lost = set()  # uuids of GPUs that answered NVMLError_GpuIsLost
        self._events = []
        self._warned = set()  # (uuid, getter) pairs already logged
        self._pcie = PcieThroughputPoller(
            nvml, [(gpu["uuid"], handle) for gpu, handle in self._gpus], pcie_interval_s
        )
        self._pcie.start()

    @property
    def nvml(self):
        """The pynvml module in use (the detectors' NVML threads share it)."""
        return self._nvml

    def gpus(self):
        return [dict(gpu) for gpu, _ in self._gpus if gpu["uuid"] not in self._lost]

    def handles(self):
        """[(uuid, NVML handle)] of every GPU found at start. A GPU lost since answers
        GPU_IS_LOST: the detectors' threads then leave it, and read_gpus() reports it."""
        return [(gpu["uuid"], handle) for gpu, handle in self._gpus]

    def read_gpus(self):
        readings = []
        for gpu, handle in self._gpus:
            uuid = gpu["uuid"]
            if uuid in self._lost:
                continue
            try:
                readings.append(self._read_gpu(uuid, handle))
            except self._nvml.NVMLError_GpuIsLost:
                log.error("GPU %d (%s) is lost: NVML answers GPU_IS_LOST", gpu["index"], uuid)
                self._lost.add(uuid)
                self._events.append(gpu_lost_event(uuid, source="nvml"))
        return readings

    def take_events(self):
        events, self._events = self._events, []
        return events

    def wait_ready(self, timeout_s):
        self._pcie.first_sweep_done.wait(timeout_s)

    def close(self):
        self._pcie.stop()
        self._pcie.join(timeout=2)
        for gpm in self._gpm.values():
            gpm.close()
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as exc:
            log.debug("nvmlShutdown: %s", exc)

    def _read_gpu(self, uuid, handle):
        nvml = self._nvml
        utilization = self._get(uuid, nvml.nvmlDeviceGetUtilizationRates, handle)
        memory = self._get(uuid, nvml.nvmlDeviceGetMemoryInfo, handle)
        power_mw = self._get(uuid, nvml.nvmlDeviceGetPowerUsage, handle)
        pcie_tx_bps, pcie_rx_bps = self._pcie.latest(uuid)
        return {
            "uuid": uuid,
            "util_pct": utilization.gpu if utilization is not None else None,
            "mem_util_pct": utilization.memory if utilization is not None else None,
            "mem_used_bytes": memory.used if memory is not None else None,
            "temp_c": self._get(
                uuid, nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU
            ),
            "power_w": power_mw / 1000 if power_mw is not None else None,
            "sm_clock_mhz": self._get(
                uuid, nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM
            ),
            "clock_event_reasons": self._get(
                uuid, nvml.nvmlDeviceGetCurrentClocksEventReasons, handle
            ),
            "ecc_dbe_volatile": self._get(
                uuid,
                nvml.nvmlDeviceGetTotalEccErrors,
                handle,
                nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                nvml.NVML_VOLATILE_ECC,
            ),
            "pcie_tx_bps": pcie_tx_bps,
            "pcie_rx_bps": pcie_rx_bps,
            **self._activity(uuid),
        }

    def _activity(self, uuid):
        """The GPU's GPM metrics since the last sample; nulls where it has none."""
        try:
            return self._gpm[uuid].read()
        except self._nvml.NVMLError_GpuIsLost:
            raise
        except self._nvml.NVMLError as exc:
            if (uuid, "gpm") not in self._warned:
                self._warned.add((uuid, "gpm"))
                log.warning("GPM metrics on %s failed: %s (reported as null)", uuid, exc)
            return NO_ACTIVITY

    def _get(self, uuid, getter, *args):
        """getter(*args), or None where the GPU does not support it or it fails. A lost
        GPU is not a failed field: NVMLError_GpuIsLost goes up to read_gpus()."""
        nvml = self._nvml
        try:
            return getter(*args)
        except nvml.NVMLError_GpuIsLost:
            raise
        except nvml.NVMLError_NotSupported:
            return None
        except nvml.NVMLError as exc:
            if (uuid, getter.__name__) not in self._warned:
                self._warned.add((uuid, getter.__name__))
                log.warning("%s on %s failed: %s (reported as null)", getter.__name__, uuid, exc)
            return None


NO_ACTIVITY = dict.fromkeys(ACTIVITY_FIELDS)


class GpmReader:
    """One GPU's GPM metrics (ACTIVITY_METRICS), as NVML's API documentation describes
    them: nvmlGpmSampleGet takes a sample, and nvmlGpmMetricsGet computes each metric over
    the time between two samples. read() takes a new sample and compares it with the one
    before, so its values cover the time since the last read (a sample interval); the
    first read has nothing to compare with and answers nulls. A GPU without GPM (before
    Hopper, or a driver without it) answers nulls throughout."""

    def __init__(self, nvml, handle):
        self._nvml = nvml
        self._handle = handle
        self._samples = []  # [previous, next], allocated by NVML
        self._have_previous = False
        if _gpm_supported(nvml, handle):
            self._samples = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]

    def read(self):
        """{field: percent or None} for every ACTIVITY_FIELDS."""
        if not self._samples:
            return NO_ACTIVITY
        nvml = self._nvml
        previous, current = self._samples
        nvml.nvmlGpmSampleGet(self._handle, current)
        self._samples = [current, previous]
        if not self._have_previous:
            self._have_previous = True
            return NO_ACTIVITY
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(ACTIVITY_METRICS)
        request.sample1 = previous
        request.sample2 = current
        for slot, metric in zip(request.metrics, ACTIVITY_METRICS.values()):
            slot.metricId = getattr(nvml, metric)
        nvml.nvmlGpmMetricsGet(request)
        return {field: (round(slot.value, 1) if slot.nvmlReturn == nvml.NVML_SUCCESS else None)
                for field, slot in zip(ACTIVITY_FIELDS, request.metrics)}

    def close(self):
        for sample in self._samples:
            try:
                self._nvml.nvmlGpmSampleFree(sample)
            except self._nvml.NVMLError as exc:
                log.debug("nvmlGpmSampleFree: %s", exc)
        self._samples = []


def _gpm_supported(nvml, handle):
    """Whether the GPU has GPM metrics (nvmlGpmQueryDeviceSupport); False where the driver
    or the pynvml in use has no GPM at all."""
    query = getattr(nvml, "nvmlGpmQueryDeviceSupport", None)
    if query is None:
        return False
    try:
        return bool(query(handle).isSupportedDevice)
    except nvml.NVMLError as exc:
        log.info("no GPM metrics (nvmlGpmQueryDeviceSupport: %s): activity fields are null",
                 exc)
        return False


class PcieThroughputPoller(threading.Thread):
    """Reads every GPU's PCIe TX and RX throughput every `interval_s` seconds in the
    background, keeping the latest values in bytes per second (NVML gives KB/s)."""

    def __init__(self, nvml, gpus, interval_s):
        super().__init__(name="pcie-throughput", daemon=True)
        self._nvml = nvml
        self._gpus = gpus  # [(uuid, handle)]
        self._interval_s = interval_s
        self._latest = {}  # uuid -> (tx_bps, rx_bps); a dict assignment is atomic
        self._gone = set()  # uuids that answered GPU_IS_LOST
        self._stopping = threading.Event()
        self.first_sweep_done = threading.Event()

    def latest(self, uuid):
        return self._latest.get(uuid, (None, None))

    def stop(self):
        self._stopping.set()

    def run(self):
        nvml = self._nvml
        while not self._stopping.is_set():
            for uuid, handle in self._gpus:
                if uuid in self._gone or self._stopping.is_set():
                    continue
                tx = self._read(uuid, handle, nvml.NVML_PCIE_UTIL_TX_BYTES)
                rx = self._read(uuid, handle, nvml.NVML_PCIE_UTIL_RX_BYTES)
                self._latest[uuid] = (tx, rx)
            self.first_sweep_done.set()
            self._stopping.wait(self._interval_s)

    def _read(self, uuid, handle, counter):
        nvml = self._nvml
        try:
            return nvml.nvmlDeviceGetPcieThroughput(handle, counter) * 1024
        except nvml.NVMLError_GpuIsLost:
            self._gone.add(uuid)  # read_gpus() reports it
        except nvml.NVMLError_NotSupported:
            pass
        except nvml.NVMLError as exc:
            log.debug("nvmlDeviceGetPcieThroughput on %s failed: %s", uuid, exc)
        return None


def _init_nvml(nvml):
    """nvmlInit(), turning the usual reasons it fails into one line an operator can act on."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError_LibraryNotFound as exc:
        raise BackendUnavailable(
            "the NVIDIA driver is not installed here: NVML (libnvidia-ml.so.1) was not "
            "found. Install the driver, or run with --simulate."
        ) from exc
    except nvml.NVMLError_DriverNotLoaded as exc:
        raise BackendUnavailable(
            "the NVIDIA driver is not loaded (NVML: Driver Not Loaded); check "
            "`nvidia-smi` and the nvidia kernel module, or run with --simulate."
        ) from exc
    except nvml.NVMLError as exc:
        raise BackendUnavailable(f"NVML failed to start: {exc}") from exc


def _describe_gpu(nvml, index, handle):
    """The hello's entry for one GPU."""
    return {
        "index": index,
        "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
        "name": _text(nvml.nvmlDeviceGetName(handle)),
        "serial": _serial(nvml, handle),
        "pci_bus_id": _text(nvml.nvmlDeviceGetPciInfo(handle).busId),
        "memory_total_bytes": nvml.nvmlDeviceGetMemoryInfo(handle).total,
    }


def _serial(nvml, handle):
    """The board's serial number (nvmlDeviceGetSerial), or None where the GPU has none or
    NVML cannot read it (PROTOCOL.md: the server then follows the GPU by its UUID)."""
    try:
        serial = _text(nvml.nvmlDeviceGetSerial(handle)).strip()
    except nvml.NVMLError:
        return None
    return serial or None


def _text(value):
    """pynvml gives some strings as bytes (ctypes char arrays such as PCI busId)."""
    return value.decode() if isinstance(value, bytes) else value
