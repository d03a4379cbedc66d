"""Slurm drains set by someone other than clusterui, from `scontrol show node <name> -o`
every `interval_s` seconds (default 30) in a thread. Started only where scontrol exists.

A State containing DRAIN (IDLE+DRAIN, MIXED+DRAIN, DOWN+DRAIN, ...) with a Reason that
does not start with "clusterui" (clusterui's own drains do) is a `slurm_drain` event
(warning, no GPU) with the state and reason; a different foreign reason later is
another event. When the drain ends, or clusterui's own reason replaces the foreign
one, a `cleared` event follows. scontrol failing (slurmctld down, say) changes nothing:
it is logged once until it works again."""

import logging

from agent import host
from agent.connection.protocol import event_frame
from agent.detectors.polling import PollingWatcher

log = logging.getLogger(__name__)

SLURM_DRAIN_INTERVAL_S = 30.0
CLUSTERUI_REASON_PREFIX = "clusterui"


def foreign_drain_reason(status):
    """The reason of a drain clusterui did not set, or None when there is none."""
    state = (status["state"] or "").upper()
    reason = (status["reason"] or "").strip()
    if "DRAIN" not in state or reason.lower().startswith(CLUSTERUI_REASON_PREFIX):
        return None
    return reason or "(no reason given)"


class SlurmDrainWatcher(PollingWatcher):
    thread_name = "slurm-drain"

    def __init__(self, node_name, interval_s=SLURM_DRAIN_INTERVAL_S):
        super().__init__(interval_s)
        self.node_name = node_name
        self._reason = None  # the foreign drain reason of the open event, if any
        self._failing = False

    def check_once(self):
        try:
            status = host.read_slurm_status(self.node_name)
        except host.SlurmError as exc:
            if not self._failing:
                self._failing = True
                log.warning("%s (drains are checked again every %g s)", exc, self.interval_s)
            return []
        self._failing = False
        reason = foreign_drain_reason(status)
        if reason == self._reason:
            return []
        self._reason = reason
        detail = {"state": status["state"], "reason": status["reason"]}
        if reason is not None:
            return [
                event_frame(
                    signature="slurm_drain",
                    severity="warning",
                    message=f"Slurm drained {self.node_name}: {reason}",
                    detail=detail,
                )
            ]
        return [
            event_frame(
                signature="slurm_drain",
                severity="info",
                message=f"the Slurm drain of {self.node_name} ended",
                detail=detail,
                state="cleared",
            )
        ]
