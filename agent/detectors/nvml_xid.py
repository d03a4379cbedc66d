"""Xid errors from NVML's event set: every GPU registered for
nvmlEventTypeXidCriticalError in one event set, waited on in a thread with
nvmlEventSetWait_v2 and a timeout, so that close() stops it within WAIT_MS.

A GPU that answers NotSupported is logged once, by name, and left to the kernel log;
a GPU that is lost (GPU_IS_LOST) is skipped quietly: the backend's read_gpus() reports
the lost GPU once, and so does nothing here."""

import ctypes
import logging

from agent.detectors.xid import XidSignal, XidSource

log = logging.getLogger(__name__)

WAIT_MS = 500
ERROR_PAUSE_S = 1.0  # after an unexpected error, so a failing wait does not spin


def handle_address(handle):
    """Where an NVML device handle points. The event's handle is another ctypes object
    for the same device, and ctypes compares pointers by object, not by address."""
    return ctypes.cast(handle, ctypes.c_void_p).value


class NvmlXidEvents(XidSource):
    thread_name = "nvml-xid"
    source = "nvml"

    def __init__(self, nvml, gpus):
        """nvml: the pynvml module; gpus: [(uuid, handle)]."""
        self._nvml = nvml
        super().__init__()
        self._event_set = None
        self._uuid_by_address = {}
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            log.warning("NVML cannot create an event set (%s): Xids come from the kernel log only", exc)
            return
        not_supported = []
        for uuid, handle in gpus:
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
            except nvml.NVMLError_NotSupported:
                not_supported.append(uuid)
                continue
            except nvml.NVMLError_GpuIsLost:
                continue
            except nvml.NVMLError as exc:
                log.warning("NVML Xid events cannot be registered for %s: %s", uuid, exc)
                continue
            self._uuid_by_address[handle_address(handle)] = uuid
        if not_supported:
            log.warning(
                "NVML does not deliver Xid events for %s (Not Supported): their Xids come "
                "from the kernel log only",
                ", ".join(not_supported),
            )
        if self._uuid_by_address:
            self._event_set = event_set
            log.info("waiting for NVML Xid events on %d GPUs", len(self._uuid_by_address))
        else:
            nvml.nvmlEventSetFree(event_set)

    @property
    def available(self):
        return self._event_set is not None

    def close(self):
        self._stop_thread()
        if self._event_set is not None:
            try:
                self._nvml.nvmlEventSetFree(self._event_set)
            except self._nvml.NVMLError as exc:
                log.debug("nvmlEventSetFree: %s", exc)
            self._event_set = None

    def _run(self):
        nvml = self._nvml
        logged = set()
        while not self._stopping.is_set():
            try:
                data = nvml.nvmlEventSetWait_v2(self._event_set, WAIT_MS)
            except nvml.NVMLError_Timeout:
                continue
            except nvml.NVMLError as exc:
                # GPU_IS_LOST among them: the backend reports the lost GPU.
                if type(exc) not in logged:
                    logged.add(type(exc))
                    log.warning("waiting for NVML Xid events: %s (the wait goes on)", exc)
                self._stopping.wait(ERROR_PAUSE_S)
                continue
            if not data.eventType & nvml.nvmlEventTypeXidCriticalError:
                continue
            self._signals.put(
                XidSignal(
                    source=self.source,
                    code=int(data.eventData),
                    gpu_uuid=self._uuid_by_address.get(handle_address(data.device)),
                )
            )
