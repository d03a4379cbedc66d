"""Passive health detectors ("watchers"): they turn what the node shows into `event`
frames (shared/PROTOCOL.md). The client calls `watcher.poll(readings)` once per sample,
with the sample's GPU readings, and sends what it returns; poll() never waits: a watcher
whose reading may block does it in a thread of its own and hands events over through a
queue. `close()` stops a watcher's threads.

    module            signature(s)                  severity  closes
    throttle          thermal_throttle,             warning   held 10 s (--throttle-hold)
                      power_brake, hw_slowdown                to open; `cleared` when gone
    ecc               ecc_dbe                       critical  `cleared` after 1 h without
                                                              a new error
    xid (+ kernel_log, nvml_xid)
                      xid:<code>                    critical  edge (server: reboot,
                                                              operator, or 1 h quiet)
    row_remap         row_remap_failure             critical  edge, once per agent run
                      row_remap_pending             warning   `cleared` when not pending
    recovery_action   gpu_recovery_action           critical  `cleared` back at NONE
    slurm_drain       slurm_drain (no GPU)          warning   `cleared` when the drain ends
    (backend)         gpu_lost                      critical  edge, from read_gpus()

make_watchers(config, backend) builds the set for the NVML backend and starts it:
throttle, ecc, Xid from /dev/kmsg (--kmsg) and NVML events, row remap, GPU recovery
action, and Slurm drain where `scontrol` exists. reading_watchers(config) are the ones
that need only the sample's readings (throttle, ecc): a backend without NVML (the
simulation's, agent/sim) starts from them.

From a script, for N seconds on the real GPUs (what `python -m agent.detectors
--seconds N` does, printing each event as a JSON line):

    from agent.backends.nvml import NvmlBackend
    from agent.config import Config
    from agent.detectors import close_watchers, make_watchers

    backend = NvmlBackend()
    watchers = make_watchers(Config(node_name="gpu-001"), backend)
    try:
        for _ in range(N):
            readings = backend.read_gpus()
            events = backend.take_events()
            for watcher in watchers:
                events.extend(watcher.poll(readings))
            ...
            time.sleep(1)
    finally:
        close_watchers(watchers)  # before backend.close(), which shuts NVML down
        backend.close()
"""

import logging
import shutil

from agent.detectors.ecc import EccWatcher
from agent.detectors.kernel_log import KmsgReader
from agent.detectors.nvml_xid import NvmlXidEvents
from agent.detectors.recovery_action import RecoveryActionWatcher
from agent.detectors.row_remap import RowRemapWatcher
from agent.detectors.slurm_drain import SlurmDrainWatcher
from agent.detectors.throttle import ThrottleWatcher
from agent.detectors.xid import XidWatcher

log = logging.getLogger(__name__)


def reading_watchers(config):
    """The watchers that read only the sample's readings: throttle and ECC."""
    return [ThrottleWatcher(hold_s=config.throttle_hold_s), EccWatcher()]


def make_watchers(config, backend):
    """The started watchers for the NVML backend; close them with close_watchers().
    config: agent.config.Config (throttle_hold_s, kmsg_path, node_name)."""
    from agent.backends.nvml import NvmlBackend

    if not isinstance(backend, NvmlBackend):
        raise TypeError(f"no watchers for a {type(backend).__name__}")
    gpus = backend.gpus()
    watchers = reading_watchers(config)
    handles = backend.handles()
    sources = [KmsgReader(config.kmsg_path), NvmlXidEvents(backend.nvml, handles)]
    sources = [source for source in sources if source.available]
    if sources:
        for source in sources:
            source.start()
        watchers.append(XidWatcher(gpus, sources))
    else:
        log.error("no Xid source: neither the kernel log nor NVML events can be read")
    threaded = [
        RowRemapWatcher(backend.nvml, handles),
        RecoveryActionWatcher(backend.nvml, handles),
    ]
    if shutil.which("scontrol") is not None:
        threaded.append(SlurmDrainWatcher(config.node_name))
    for watcher in threaded:
        watcher.start()
        watchers.append(watcher)
    return watchers


def close_watchers(watchers):
    for watcher in watchers:
        watcher.close()
