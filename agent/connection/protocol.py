"""Builders for the frames of the agent protocol (shared/PROTOCOL.md, version 1).

Every frame is a dict with a string `type`; encode() turns one into the JSON text that
goes on the wire and refuses anything the server would not take (over 1 MiB, NaN). The
builders cut free text to PROTOCOL.md's limits (a Slurm drain reason or a kernel line can be
long), as the server would, so what is stored is what the agent sent."""

import json
import time
import uuid

MAX_FRAME_BYTES = 1024 * 1024  # the server closes with 1009 above this

SEVERITIES = ("info", "warning", "critical")

# PROTOCOL.md, "Limits": free text over these is cut, ending in "…".
MESSAGE_LIMIT = 1000  # an event's message, a result's message, a string inside `detail`
SLURM_REASON_LIMIT = 500


def truncated(text, limit):
    if not isinstance(text, str) or len(text) <= limit:
        return text
    return text[:limit - 1] + "…"


def counted(count, noun, nouns=None):
    """"1 process", "3 processes": a count with its noun, for event messages."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


def _detail_truncated(value):
    if isinstance(value, str):
        return truncated(value, MESSAGE_LIMIT)
    if isinstance(value, dict):
        return {key: _detail_truncated(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_detail_truncated(item) for item in value]
    return value


class FrameError(ValueError):
    """A frame that must not be sent: too large, or not valid JSON."""


def encode(frame):
    """The frame as JSON text. ASCII only, so its length is its size in bytes."""
    try:
        text = json.dumps(frame, separators=(",", ":"), allow_nan=False)
    except ValueError as exc:  # NaN or infinity somewhere
        raise FrameError(f"{frame.get('type')} frame is not valid JSON: {exc}") from exc
    if len(text) > MAX_FRAME_BYTES:
        raise FrameError(f"{frame.get('type')} frame is {len(text)} bytes, over the 1 MiB limit")
    return text


def hello_frame(*, node, boot_id, agent_version, driver_version, cuda_version, gpus, slurm,
                outbox_dropped=0):
    """gpus: [{index, uuid, name, pci_bus_id, memory_total_bytes}]; slurm: None or
    {"state", "reason"}; outbox_dropped: events the full outbox dropped since the server was
    last told (sent only when there are some)."""
    frame = {
        "type": "hello",
        "node": node,
        "boot_id": boot_id,
        "agent_version": agent_version,
        "driver_version": driver_version,
        "cuda_version": cuda_version,
        "gpus": gpus,
        "slurm": slurm if slurm is None else {
            **slurm, "reason": truncated(slurm.get("reason"), SLURM_REASON_LIMIT)},
    }
    if outbox_dropped:
        frame["outbox_dropped"] = outbox_dropped
    return frame


def sample_frame(*, seq, gpus, node, ts=None):
    """gpus: one dict per GPU (uuid and the readings); node: cpu, memory and network."""
    return {
        "type": "sample",
        "seq": seq,
        "ts": time.time() if ts is None else ts,
        "gpus": gpus,
        "node": node,
    }


def event_frame(*, signature, severity, message, gpu_uuid=None, detail=None, state="active"):
    """A new event with its own id. `state` is "active", or "cleared" when a held
    signal ends (a cleared event has a new id and the signature of the one it ends)."""
    if severity not in SEVERITIES:
        raise ValueError(f"severity must be one of {SEVERITIES}, not {severity!r}")
    if state not in ("active", "cleared"):
        raise ValueError(f"state must be 'active' or 'cleared', not {state!r}")
    return {
        "type": "event",
        "id": str(uuid.uuid4()),
        "ts": time.time(),
        "signature": signature,
        "gpu_uuid": gpu_uuid,
        "severity": severity,
        "message": truncated(message, MESSAGE_LIMIT),
        "detail": _detail_truncated(detail or {}),
        "state": state,
    }


def command_result_frame(*, command_id, status, message=""):
    return {"type": "command_result", "id": command_id, "status": status,
            "message": truncated(message, MESSAGE_LIMIT)}


def check_result_frame(*, run_id, status, message="", metrics=None):
    return {
        "type": "check_result",
        "run_id": run_id,
        "status": status,
        "metrics": metrics or {},
        "message": truncated(message, MESSAGE_LIMIT),
    }
