"""The agent protocol's frames (shared/PROTOCOL.md, version 1): parsing and validation.

Pure functions, no database: the consumer calls parse_frame() on every text frame and gets
either a validated dict or BadFrame with a message naming the field, e.g.
"sample.gpus[0].temp_c: expected a number".

Samples are most of the traffic (one a second from every node), so they take a fast path:
orjson decodes them and a few set operations check them (_sample_is_valid). Whatever the
fast path does not accept outright goes the exact way every other frame goes: the standard
library's json and the schema below, which write the error messages. The one difference:
an integer beyond 64 bits in a number field of a sample is read as a float (orjson's
reading; in an integer field it sends the frame the exact way).
"""

import json
import re
import uuid

import orjson

MAX_FRAME_BYTES = 1024 * 1024
NODE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,63}$")


class BadFrame(Exception):
    """A frame the server cannot accept. `event_id` is set for an event whose id could be read."""

    def __init__(self, message, *, code="bad_message", event_id=None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.event_id = event_id


# Field kinds. Each checker returns an error text, or None when the value is acceptable.
def _integer(value):
    if isinstance(value, bool) or not isinstance(value, int):
        return "expected an integer"
    return None


def _number(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "expected a number"
    return None


def _string(value):
    return None if isinstance(value, str) else "expected a string"


def _nonempty_string(value):
    if not isinstance(value, str) or not value:
        return "expected a non-empty string"
    return None


def _boolean(value):
    return None if isinstance(value, bool) else "expected true or false"


def _object(value):
    return None if isinstance(value, dict) else "expected an object"


def _one_of(*choices):
    def check(value):
        if value not in choices:
            return "expected one of " + ", ".join(choices)
        return None

    return check


def _node_name(value):
    if not isinstance(value, str) or not NODE_NAME.match(value):
        return "expected 1-63 letters, digits, '-', '_' or '.'"
    return None


def _uuid_string(value):
    if not isinstance(value, str):
        return "expected a UUID string"
    try:
        uuid.UUID(value)
    except ValueError:
        return "expected a UUID string"
    return None


def _positive_integer(value):
    return _integer(value) or (None if value >= 1 else "expected an integer >= 1")


# frame type -> {field: (checker, required)}. Optional fields may also be null.
HELLO_GPU = {
    "index": (_integer, True),
    "uuid": (_nonempty_string, True),
    "name": (_string, False),
    "pci_bus_id": (_string, False),
    "memory_total_bytes": (_integer, False),
}
SAMPLE_GPU = {
    "uuid": (_nonempty_string, True),
    **{
        field: (_number, False)
        for field in ("util_pct", "mem_util_pct", "mem_used_bytes", "temp_c", "power_w",
                      "sm_clock_mhz", "pcie_tx_bps", "pcie_rx_bps")
    },
    "clock_event_reasons": (_integer, False),
    "ecc_dbe_volatile": (_integer, False),
}
SAMPLE_NODE = {
    field: (_number, False) for field in ("cpu_pct", "mem_used_bytes", "net_rx_bps", "net_tx_bps")
}
SLURM = {"state": (_string, False), "reason": (_string, False)}

FRAMES = {
    "hello": {
        "node": (_node_name, True),
        "boot_id": (_nonempty_string, True),
        "agent_version": (_string, True),
        "driver_version": (_string, False),
        "cuda_version": (_string, False),
        "gpus": ([HELLO_GPU], True),
        "slurm": (SLURM, False),
    },
    "sample": {
        "seq": (_integer, True),
        "ts": (_number, True),
        "gpus": ([SAMPLE_GPU], True),
        "node": (SAMPLE_NODE, False),
    },
    "event": {
        "id": (_uuid_string, True),
        "ts": (_number, True),
        "signature": (_nonempty_string, True),
        "severity": (_one_of("info", "warning", "critical"), True),
        "message": (_string, True),
        "gpu_uuid": (_string, False),
        "state": (_one_of("active", "cleared"), False),
        "count": (_positive_integer, False),
        "detail": (_object, False),
    },
    "check_result": {
        "run_id": (_integer, True),
        "status": (_one_of("passed", "failed", "error"), True),
        "metrics": (_object, False),
        "message": (_string, False),
    },
    "command_result": {
        "id": (_integer, True),
        "status": (_one_of("accepted", "ok", "failed"), True),
        "message": (_string, False),
    },
    "script_result": {
        "script_id": (_integer, True),
        "version": (_integer, False),
        "event": (_one_of("node_boot", "job_start", "job_end"), True),
        "job_id": (_string, False),
        "exit_code": (_integer, "present"),
        "duration_s": (_number, True),
        "output_tail": (_string, False),
        "timed_out": (_boolean, False),
        "ts": (_number, False),
    },
}


def _check_fields(obj, schema, path):
    if not isinstance(obj, dict):
        raise BadFrame(f"{path}: expected an object")
    for field, (kind, required) in schema.items():
        where = f"{path}.{field}"
        if field not in obj:
            if required:
                raise BadFrame(f"{where}: required")
            continue
        value = obj[field]
        if value is None:
            if required is True:
                raise BadFrame(f"{where}: required, got null")
            continue  # optional fields, and "present" ones (exit_code), may be null
        if isinstance(kind, list):
            if not isinstance(value, list):
                raise BadFrame(f"{where}: expected a list")
            for i, item in enumerate(value):
                _check_fields(item, kind[0], f"{where}[{i}]")
        elif isinstance(kind, dict):
            _check_fields(value, kind, where)
        else:
            error = kind(value)
            if error:
                raise BadFrame(f"{where}: {error}")


def _check_unique(items, fields, path):
    for field in fields:
        seen = set()
        for i, item in enumerate(items):
            if item[field] in seen:
                raise BadFrame(f"{path}[{i}].{field}: {item[field]!r} appears twice")
            seen.add(item[field])


def _refuse_constant(name):
    raise ValueError(f"{name} is not JSON")


# The sample fast path: the value types a valid sample's fields may have (JSON gives no
# subclasses but bool, which is not in these sets).
_NUMBER = frozenset((int, float, type(None)))
_REQUIRED_NUMBER = frozenset((int, float))
_INTEGER = frozenset((int, type(None)))
_OBJECT = frozenset((dict, type(None)))
_SAMPLE_GPU_NUMBERS = tuple(f for f, (kind, _) in SAMPLE_GPU.items() if kind is _number)
_SAMPLE_GPU_INTEGERS = tuple(f for f, (kind, _) in SAMPLE_GPU.items() if kind is _integer)
_SAMPLE_NODE_NUMBERS = tuple(SAMPLE_NODE)


def _sample_is_valid(frame):
    """True for a sample that is certainly valid; False: it needs the exact check."""
    if type(frame.get("seq")) is not int or type(frame.get("ts")) not in _REQUIRED_NUMBER:
        return False
    gpus = frame.get("gpus")
    if type(gpus) is not list:
        return False
    for gpu in gpus:
        if (type(gpu) is not dict or type(gpu.get("uuid")) is not str or not gpu["uuid"]
                or not _NUMBER.issuperset(map(type, map(gpu.get, _SAMPLE_GPU_NUMBERS)))
                or not _INTEGER.issuperset(map(type, map(gpu.get, _SAMPLE_GPU_INTEGERS)))):
            return False
    node = frame.get("node")
    if type(node) not in _OBJECT:
        return False
    return node is None or _NUMBER.issuperset(map(type, map(node.get, _SAMPLE_NODE_NUMBERS)))


def _fast_sample(text):
    """The frame, when it is a valid sample by the fast path; None otherwise."""
    try:
        frame = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None  # the standard library says why (or reads what orjson refuses, e.g. 1e400)
    if type(frame) is dict and frame.get("type") == "sample" and _sample_is_valid(frame):
        return frame
    return None


def parse_frame(text):
    """A validated frame dict from one WebSocket text message, or BadFrame."""
    if isinstance(text, (bytes, bytearray)):
        raise BadFrame("binary frames are not part of the protocol: send JSON text")
    frame = _fast_sample(text)
    if frame is not None:
        return frame
    try:
        frame = json.loads(text, parse_constant=_refuse_constant)
    except ValueError as exc:
        raise BadFrame(f"not JSON: {exc}") from None
    if not isinstance(frame, dict):
        raise BadFrame("a frame must be a JSON object")
    frame_type = frame.get("type")
    if not isinstance(frame_type, str):
        raise BadFrame("type: required, a string")
    schema = FRAMES.get(frame_type)
    if schema is None:
        raise BadFrame(f"type: unknown frame type {frame_type!r}")
    try:
        _check_fields(frame, schema, frame_type)
        if frame_type == "hello":
            _check_unique(frame["gpus"], ("index", "uuid"), "hello.gpus")
    except BadFrame as exc:
        if frame_type == "event" and _uuid_string(frame.get("id")) is None:
            exc.event_id = frame["id"]
        raise
    return frame
