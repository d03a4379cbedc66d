"""Where GPU readings come from: `nvml.NvmlBackend`, the real GPUs through NVIDIA's
NVML (pynvml), and the small interface every backend shares (the simulation's,
agent/sim/backend.py, too), with what they build their readings and events from.

A backend has:

    driver_version, cuda_version   strings for the hello ("580.159.04", "13.0")
    gpus()          the hello's GPU list: [{index, uuid, name, pci_bus_id,
                    memory_total_bytes}], without GPUs that were lost
    read_gpus()     the sample's GPU list: one dict per GPU with "uuid" and every
                    field in GPU_FIELDS (None where the GPU does not support it)
    take_events()   event frames seen since the last call (protocol.event_frame)
    wait_ready(timeout_s)   wait until slow readings have a first value (print-once)
    close()
"""

from agent.connection.protocol import event_frame

# How busy a GPU's parts really are, 0-100 (NVML's GPM metrics, Hopper and later; null on
# older GPUs), each with the NVML metric it is read from. /metrics exports them as
# dcgm-exporter's DCGM_FI_PROF_* fields (gateway/metrics.py).
ACTIVITY_METRICS = {
    "gr_engine_active_pct": "NVML_GPM_METRIC_GRAPHICS_UTIL",
    "sm_active_pct": "NVML_GPM_METRIC_SM_UTIL",
    "sm_occupancy_pct": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "tensor_active_pct": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "dram_active_pct": "NVML_GPM_METRIC_DRAM_BW_UTIL",
}
ACTIVITY_FIELDS = tuple(ACTIVITY_METRICS)

# The per-GPU fields of a sample, as PROTOCOL.md names them.
GPU_FIELDS = (
    "util_pct",
    "mem_util_pct",
    "mem_used_bytes",
    "temp_c",
    "power_w",
    "sm_clock_mhz",
    "clock_event_reasons",
    "ecc_dbe_volatile",
    "pcie_tx_bps",
    "pcie_rx_bps",
    *ACTIVITY_FIELDS,
)

# nvmlClocksEventReason* bits (PROTOCOL.md lists the ones the server reads).
CLOCK_EVENT_GPU_IDLE = 0x1
CLOCK_EVENT_SW_POWER_CAP = 0x4
CLOCK_EVENT_HW_SLOWDOWN = 0x8
CLOCK_EVENT_SW_THERMAL = 0x20
CLOCK_EVENT_HW_THERMAL = 0x40
CLOCK_EVENT_HW_POWER_BRAKE = 0x80
# Every bit NVML defines, as nvidia-smi -q names it (its "Clocks Event Reasons" section).
CLOCK_EVENT_NAMES = {
    0x1: "idle",
    0x2: "applications clocks setting",
    0x4: "SW power cap",
    0x8: "HW slowdown",
    0x10: "sync boost",
    0x20: "SW thermal slowdown",
    0x40: "HW thermal slowdown",
    0x80: "HW power brake slowdown",
    0x100: "display clock setting",
}


def clock_event_names(reasons):
    """The reasons of an nvmlClocksEventReason mask in words ("SW power cap, HW thermal
    slowdown"); a bit NVML does not define as its hex value."""
    names = [name for bit, name in CLOCK_EVENT_NAMES.items() if reasons & bit]
    unknown = reasons & ~sum(CLOCK_EVENT_NAMES)
    if unknown:
        names.append(f"{unknown:#x}")
    return ", ".join(names) or "none"


class BackendUnavailable(Exception):
    """The backend cannot start (no NVIDIA driver, say). The message says why, in one
    line an operator can act on."""


def cuda_version_text(cuda_driver_version):
    """NVML's integer CUDA driver version as "major.minor": 13000 -> "13.0", 12040 -> "12.4"."""
    major = cuda_driver_version // 1000
    minor = (cuda_driver_version % 1000) // 10
    return f"{major}.{minor}"


def gpu_lost_event(gpu_uuid, source):
    """The event for a GPU that stopped answering (NVML_ERROR_GPU_IS_LOST)."""
    return event_frame(
        signature="gpu_lost",
        severity="critical",
        message="GPU is lost: it no longer answers the driver",
        gpu_uuid=gpu_uuid,
        detail={"source": source},
    )
