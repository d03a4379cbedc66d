"""Volatile double-bit ECC errors, from each sample's ecc_dbe_volatile (NVML's
uncorrected volatile count, which starts at 0 when the driver loads).

The count rising between two samples of a GPU is an `ecc_dbe` event (critical) with the
count before and after; every further rise is another. It is a held signal: once the
count has not risen for `quiet_s` seconds (default one hour, as long as a quiet Xid stays
open on the server), a `cleared` event follows. The first sample only sets the baseline:
errors counted before the agent started are not new. A lower count (the driver was
reloaded) sets a new baseline."""

import time

from agent.connection.protocol import event_frame

ECC_QUIET_S = 3600.0


class EccWatcher:
    def __init__(self, quiet_s=ECC_QUIET_S, clock=time.monotonic):
        self.quiet_s = quiet_s
        self._clock = clock
        self._last = {}  # gpu uuid -> the last count read
        self._rose_at = {}  # gpu uuid -> when its count last rose, while the event is open

    def poll(self, readings):
        now = self._clock()
        events = []
        for gpu in readings:
            uuid = gpu["uuid"]
            count = gpu.get("ecc_dbe_volatile")
            if count is None:
                continue
            before = self._last.get(uuid)
            self._last[uuid] = count
            if before is not None and count > before:
                self._rose_at[uuid] = now
                events.append(
                    event_frame(
                        signature="ecc_dbe",
                        severity="critical",
                        message=(
                            f"{count - before} new volatile double-bit ECC errors "
                            f"({before} -> {count})"
                        ),
                        gpu_uuid=uuid,
                        detail={"before": before, "after": count},
                    )
                )
            elif uuid in self._rose_at and now - self._rose_at[uuid] >= self.quiet_s:
                del self._rose_at[uuid]
                events.append(
                    event_frame(
                        signature="ecc_dbe",
                        severity="info",
                        message=f"no new double-bit ECC errors for {self.quiet_s:g} s",
                        gpu_uuid=uuid,
                        detail={"after": count},
                        state="cleared",
                    )
                )
        return events

    def close(self):
        pass  # nothing runs in the background
