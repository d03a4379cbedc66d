"""Row remapping, from nvmlDeviceGetRemappedRows (NVML backend only), read every
`interval_s` seconds (default 60: remapping changes at an error, rarely) in a thread.

    row_remap_failure  critical  the GPU failed to remap a row (NVIDIA's RMA criterion).
                                 It stays failed, so it is an edge: one event per agent
                                 run, closed on the server like an Xid.
    row_remap_pending  warning   a remap waits for the next GPU reset (a reboot here) to
                                 take effect; `cleared` once it is no longer pending.

A GPU that answers NotSupported is not read again (logged once); a lost GPU neither (the
backend reports it)."""

import logging

from agent.connection.protocol import event_frame
from agent.detectors.polling import PollingWatcher

log = logging.getLogger(__name__)

ROW_REMAP_INTERVAL_S = 60.0


class RowRemapWatcher(PollingWatcher):
    thread_name = "row-remap"

    def __init__(self, nvml, gpus, interval_s=ROW_REMAP_INTERVAL_S):
        """nvml: the pynvml module; gpus: [(uuid, handle)]."""
        super().__init__(interval_s)
        self._nvml = nvml
        self._gpus = list(gpus)
        self._failed = set()  # uuids with a row_remap_failure sent
        self._pending = set()  # uuids with an active row_remap_pending
        self._warned = set()

    def check_once(self):
        nvml = self._nvml
        events = []
        for uuid, handle in list(self._gpus):
            try:
                corrected, uncorrectable, pending, failure = nvml.nvmlDeviceGetRemappedRows(handle)
            except nvml.NVMLError_GpuIsLost:
                self._gpus.remove((uuid, handle))
                continue
            except nvml.NVMLError_NotSupported:
                log.info("%s does not support row remapping: not watched", uuid)
                self._gpus.remove((uuid, handle))
                continue
            except nvml.NVMLError as exc:
                if uuid not in self._warned:
                    self._warned.add(uuid)
                    log.warning("nvmlDeviceGetRemappedRows on %s failed: %s", uuid, exc)
                continue
            log.debug(
                "%s: remapped rows: %d correctable, %d uncorrectable, pending %d, failure %d",
                uuid,
                corrected,
                uncorrectable,
                pending,
                failure,
            )
            detail = {
                "correctable_rows": corrected,
                "uncorrectable_rows": uncorrectable,
                "pending": bool(pending),
                "failure": bool(failure),
            }
            if failure and uuid not in self._failed:
                self._failed.add(uuid)
                events.append(
                    event_frame(
                        signature="row_remap_failure",
                        severity="critical",
                        message="row remapping failed: the GPU memory cannot repair itself",
                        gpu_uuid=uuid,
                        detail=detail,
                    )
                )
            if pending and uuid not in self._pending:
                self._pending.add(uuid)
                events.append(
                    event_frame(
                        signature="row_remap_pending",
                        severity="warning",
                        message="a row remap is pending: it takes effect at the next GPU reset",
                        gpu_uuid=uuid,
                        detail=detail,
                    )
                )
            elif not pending and uuid in self._pending:
                self._pending.discard(uuid)
                events.append(
                    event_frame(
                        signature="row_remap_pending",
                        severity="info",
                        message="no row remap is pending any more",
                        gpu_uuid=uuid,
                        detail=detail,
                        state="cleared",
                    )
                )
        self.finished = not self._gpus
        return events
