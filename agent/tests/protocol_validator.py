"""Checks frames against shared/PROTOCOL.md's Fields table, written from the document
(not from the agent's code), for the frames the agent sends."""

import re
import uuid

NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
SIGNATURE = re.compile(r"[a-z0-9_:.-]{1,64}")
XID_SIGNATURE = re.compile(r"xid:[0-9]+")

# PROTOCOL.md's sample example: every GPU field the agent reports.
SAMPLE_GPU_FIELDS = {
    "uuid",
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
    # Proposed for PROTOCOL.md (issue 27's closing note): optional GPU activity fields,
    # numbers in percent as the `_pct` unit says, null where the GPU has no GPM.
    "gr_engine_active_pct",
    "sm_active_pct",
    "sm_occupancy_pct",
    "tensor_active_pct",
    "dram_active_pct",
}
SAMPLE_NODE_FIELDS = {"cpu_pct", "mem_used_bytes", "net_rx_bps", "net_tx_bps"}
INTEGER_GPU_FIELDS = {"clock_event_reasons", "ecc_dbe_volatile", "mem_used_bytes"}


def is_integer(value):
    """A JSON integer: not a bool, not 812.0."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def problems(frame):
    """What is wrong with the frame, as a list of messages (empty: it is valid)."""
    if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
        return ["not an object with a string type"]
    check = {"hello": _hello, "sample": _sample, "event": _event}.get(frame["type"])
    if check is None:
        return [f"unknown type {frame['type']!r}"]
    return check(frame)


def _hello(frame):
    found = []
    if not isinstance(frame.get("node"), str) or not NODE_NAME.fullmatch(frame["node"]):
        found.append("hello.node: 1-63 letters, digits, '-', '_', '.'")
    for name in ("boot_id", "agent_version"):
        if not isinstance(frame.get(name), str) or not frame[name]:
            found.append(f"hello.{name}: required string")
    gpus = frame.get("gpus")
    if not isinstance(gpus, list):
        return found + ["hello.gpus: required list"]
    for i, gpu in enumerate(gpus):
        if not isinstance(gpu, dict) or not is_integer(gpu.get("index")):
            found.append(f"hello.gpus[{i}].index: required integer")
        elif not isinstance(gpu.get("uuid"), str):
            found.append(f"hello.gpus[{i}].uuid: required string")
    slurm = frame.get("slurm")
    if slurm is not None and not isinstance(slurm, dict):
        found.append("hello.slurm: null or an object")
    elif slurm is not None and len(slurm.get("reason") or "") > 500:
        found.append("hello.slurm.reason: at most 500 characters")
    return found


def _sample(frame):
    found = []
    if not is_integer(frame.get("seq")):
        found.append("sample.seq: required integer")
    if not is_number(frame.get("ts")):
        found.append("sample.ts: required number")
    gpus = frame.get("gpus")
    if not isinstance(gpus, list):
        return found + ["sample.gpus: required list"]
    for i, gpu in enumerate(gpus):
        if not isinstance(gpu, dict) or not isinstance(gpu.get("uuid"), str):
            found.append(f"sample.gpus[{i}].uuid: required string")
            continue
        if set(gpu) != SAMPLE_GPU_FIELDS:
            found.append(f"sample.gpus[{i}]: fields {sorted(set(gpu) ^ SAMPLE_GPU_FIELDS)} differ")
        for name in SAMPLE_GPU_FIELDS - {"uuid"}:
            value = gpu.get(name)
            if value is None:
                continue
            if not is_number(value) or (name in INTEGER_GPU_FIELDS and not is_integer(value)):
                found.append(f"sample.gpus[{i}].{name}: a number or null, not {value!r}")
    node = frame.get("node")
    if node is not None:
        if not isinstance(node, dict) or set(node) != SAMPLE_NODE_FIELDS:
            found.append("sample.node: cpu_pct, mem_used_bytes, net_rx_bps, net_tx_bps")
        else:
            for name, value in node.items():
                if value is not None and not is_number(value):
                    found.append(f"sample.node.{name}: a number or null, not {value!r}")
    return found


def _event(frame):
    found = []
    try:
        uuid.UUID(frame.get("id"))
    except (TypeError, ValueError, AttributeError):
        found.append("event.id: a UUID string")
    if not is_number(frame.get("ts")):
        found.append("event.ts: required number")
    signature = frame.get("signature")
    if not isinstance(signature, str) or not SIGNATURE.fullmatch(signature) or (
            signature.startswith("xid:") and not XID_SIGNATURE.fullmatch(signature)):
        found.append("event.signature: 1-64 of a-z 0-9 _ : . -, ASCII digits after xid:")
    if frame.get("severity") not in ("info", "warning", "critical"):
        found.append("event.severity: info, warning or critical")
    if not isinstance(frame.get("message"), str) or len(frame["message"]) > 1000:
        found.append("event.message: required string of at most 1,000 characters")
    if frame.get("gpu_uuid") is not None and not isinstance(frame["gpu_uuid"], str):
        found.append("event.gpu_uuid: a string or null")
    if frame.get("state", "active") not in ("active", "cleared"):
        found.append("event.state: active or cleared")
    if "count" in frame and not (is_integer(frame["count"]) and frame["count"] >= 1):
        found.append("event.count: an integer >= 1")
    return found
