"""Throttling, from each sample's clock_event_reasons (NVML's nvmlClocksEventReason* bits).

    thermal_throttle   0x20 SW thermal or 0x40 HW thermal slowdown
    power_brake        0x80 HW power brake slowdown
    hw_slowdown        0x8 HW slowdown that neither 0x40 nor 0x80 explains

0x4 (SW power cap) is how a GPU runs at its power limit under load (the real H200 under
a bf16 matmul reads 4), never a fault; 0x1 (idle) neither. NVML reports HW slowdown
(0x8) together with the HW thermal or power brake bit that caused it, as
`nvidia-smi -q` nests them, so one cause raises one event, the specific one.

A signal becomes an `active` event (warning) once it has held in every sample for
`hold_s` seconds (default 10); a `cleared` event (same signature and GPU, new id) follows
in the first sample without it. A GPU with no reading (null, or gone from the sample)
keeps its state: a lost GPU has its own event."""

import time

from agent.backends import (
    CLOCK_EVENT_HW_POWER_BRAKE,
    CLOCK_EVENT_HW_SLOWDOWN,
    CLOCK_EVENT_HW_THERMAL,
    CLOCK_EVENT_SW_THERMAL,
    clock_event_names,
)
from agent.connection.protocol import event_frame

THROTTLE_HOLD_S = 10.0

SIGNATURES = ("thermal_throttle", "power_brake", "hw_slowdown")

_DESCRIPTIONS = {
    "thermal_throttle": "thermal slowdown",
    "power_brake": "HW power brake slowdown",
    "hw_slowdown": "HW slowdown",
}


def throttle_signatures(reasons):
    """The throttling signatures a clock event reasons mask shows."""
    found = set()
    if reasons & (CLOCK_EVENT_SW_THERMAL | CLOCK_EVENT_HW_THERMAL):
        found.add("thermal_throttle")
    if reasons & CLOCK_EVENT_HW_POWER_BRAKE:
        found.add("power_brake")
    if reasons & CLOCK_EVENT_HW_SLOWDOWN and not reasons & (
        CLOCK_EVENT_HW_THERMAL | CLOCK_EVENT_HW_POWER_BRAKE
    ):
        found.add("hw_slowdown")
    return found


class ThrottleWatcher:
    def __init__(self, hold_s=THROTTLE_HOLD_S, clock=time.monotonic):
        self.hold_s = hold_s
        self._clock = clock
        self._since = {}  # (gpu uuid, signature) -> when the signal was first seen
        self._active = set()  # (gpu uuid, signature) pairs with an active event sent

    def poll(self, readings):
        now = self._clock()
        events = []
        for gpu in readings:
            reasons = gpu.get("clock_event_reasons")
            if reasons is None:
                continue
            present = throttle_signatures(reasons)
            for signature in SIGNATURES:
                key = (gpu["uuid"], signature)
                if signature in present:
                    since = self._since.setdefault(key, now)
                    if key not in self._active and now - since >= self.hold_s:
                        self._active.add(key)
                        events.append(self._event(gpu, signature, now - since, "active"))
                else:
                    since = self._since.pop(key, now)
                    if key in self._active:
                        self._active.discard(key)
                        events.append(self._event(gpu, signature, now - since, "cleared"))
        return events

    def close(self):
        pass  # nothing runs in the background

    def _event(self, gpu, signature, held_s, state):
        reasons = gpu["clock_event_reasons"]
        what = _DESCRIPTIONS[signature]
        if state == "active":
            message = f"{what} held for {held_s:.0f} s (clock event reasons: " \
                      f"{clock_event_names(reasons)})"
        else:
            message = f"{what} ended after {held_s:.0f} s"
        return event_frame(
            signature=signature,
            severity="warning" if state == "active" else "info",
            message=message,
            gpu_uuid=gpu["uuid"],
            detail={
                "clock_event_reasons": reasons,
                "temp_c": gpu.get("temp_c"),
                "sm_clock_mhz": gpu.get("sm_clock_mhz"),
                "held_s": round(held_s, 1),
            },
            state=state,
        )
