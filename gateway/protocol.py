"""The agent protocol's frames (shared/PROTOCOL.md, version 1): parsing and validation.

Pure functions, no database: a text frame is either valid or BadFrame with a message naming
the field, e.g. "sample.gpus[0].temp_c: expected a number". parse_frame() gives a valid
frame as a dict; the consumer calls fast_sample() and exact_frame() itself, so that a sample
on the fast path stays a FastSample (msgspec's structs) all the way into the live store.

Every value a frame carries is held to PROTOCOL.md's Limits before anything stores it:
every string is valid Unicode without NUL, every number finite, every integer within 64
bits (_check_values walks the whole frame), identifiers have a length and a shape, and free
text over its limit is cut to it, ending in "…" (the frame is changed in place).

Node hygiene (issue 17; to be written into PROTOCOL.md), all optional, in PROTOCOL.md's
limit classes:

- sample.hygiene: {"slurmd": {state, pid, since, restarts, last_restart_at, watched_by,
  restart}, "processes": {zombies, orphans, tasks, pid_max, checked_at}, "gres": {match,
  nvml_gpus, slurm_gpus, checked_at}} (HYGIENE: identifiers of 16 characters, integers >= 0,
  numbers, booleans). Sent when the readings change and at least once a minute, and in the
  first sample of a connection; the server keeps the latest with the node's live entry.
- events with new signatures (healthchecks.signatures says what each means):
  `slurmd_restarted` and `job_cleanup` (info notices: each its own event, closed at once),
  `slurmd_down`, `slurmd_flapping`, `zombie_processes`, `pid_pressure`, `job_leftovers`,
  `gres_drift` (warning, held: a `cleared` event ends each). Their `detail` keeps the
  16 KiB limit: lists are cut by the agent, with their totals.
- commands `cleanup` (end the orphans of ended jobs, signal zombies' parents) and
  `reconfigure` (the repair: Slurm's GPU view rebuilt from the hardware): `accepted`, then
  `ok` with what was done, or `failed` with why.

Samples are most of the traffic (one a second from every node), so they take a fast path:
msgspec decodes and checks them in one pass against types made from the schema below
(fast_sample), and a sample that went the exact way is made into the same structs
(as_fast_sample). Whatever the fast path does not accept outright goes the exact way every
other frame goes: the standard library's json and the schema, which write the error
messages.
"""

import json
import math
import re
from dataclasses import dataclass
from typing import Annotated, Literal, Optional, Union

import msgspec
import orjson

from nodes.live_fold import LiveSample
from nodes.rollups import READING_MAX, reading

MAX_FRAME_BYTES = 1024 * 1024
INT64_MIN, INT64_MAX = -2 ** 63, 2 ** 63 - 1
COUNT_MAX = 2 ** 31 - 1
GPU_INDEX_MAX = 1023
DETAIL_MAX_BYTES = 16 * 1024
ELLIPSIS = "…"

# hello.node: starts with a letter or digit (a leading "-" would be an option to scontrol or
# a provider command). fullmatch() everywhere: "$" would let a trailing newline through.
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
SIGNATURE = re.compile(r"[a-z0-9_:.-]{1,64}")
XID_SIGNATURE = re.compile(r"xid:[0-9]+")  # ASCII digits: str.isdigit() takes "٧٩" too
EVENT_ID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
# What no stored string may hold: NUL (PostgreSQL's text and jsonb refuse it) and a lone
# surrogate (not Unicode: it cannot be encoded as UTF-8).
BAD_CHARACTER = re.compile("[\x00\ud800-\udfff]")


class BadFrame(Exception):
    """A frame the server cannot accept. `event_id` is set for an event whose id could be read."""

    def __init__(self, message, *, code="bad_message", event_id=None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.event_id = event_id


def truncated(text, limit, *, keep="start"):
    """`text` cut to `limit` characters, the cut marked with "…" (keep="end": the tail)."""
    if len(text) <= limit:
        return text
    if keep == "end":
        return ELLIPSIS + text[len(text) - limit + 1:]
    return text[:limit - 1] + ELLIPSIS


# Field kinds. Each checker returns an error text, or None when the value is acceptable. A
# free-text checker also names its limit (`truncate_at`): _check_fields cuts the value to it.
def _integer_in(low, high):
    def check(value):
        if isinstance(value, bool) or not isinstance(value, int):
            return "expected an integer"
        if not low <= value <= high:
            return f"expected an integer from {low} to {high}"
        return None

    return check


_integer = _integer_in(INT64_MIN, INT64_MAX)


def _number(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "expected a number"
    return None  # finite and within 64 bits: _check_values


def _text(limit, *, required=False):
    """An identifier: a string of at most `limit` characters (non-empty when required)."""
    def check(value):
        if not isinstance(value, str) or (required and not value):
            return "expected a non-empty string" if required else "expected a string"
        if len(value) > limit:
            return f"expected at most {limit} characters, got {len(value)}"
        return None

    return check


def _free_text(limit, *, keep="start"):
    """Free text: any string; one over `limit` characters is cut to it."""
    def check(value):
        return None if isinstance(value, str) else "expected a string"

    check.truncate_at, check.keep = limit, keep
    return check


def _boolean(value):
    return None if isinstance(value, bool) else "expected true or false"


def _detail(value):
    """A JSON object of at most 16 KiB encoded, its strings cut to 1,000 characters (the
    caller has cut them: _check_fields)."""
    if not isinstance(value, dict):
        return "expected an object"
    size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
    if size > DETAIL_MAX_BYTES:
        return f"expected at most {DETAIL_MAX_BYTES} bytes of JSON, got {size}"
    return None


_detail.truncate_strings_at = 1000


def _one_of(*choices):
    def check(value):
        if value not in choices:
            return "expected one of " + ", ".join(choices)
        return None

    return check


def _node_name(value):
    if not isinstance(value, str) or not NODE_NAME.fullmatch(value):
        return ("expected 1-63 ASCII letters, digits, '-', '_' or '.', starting with a letter "
                "or digit")
    return None


def _signature(value):
    if not isinstance(value, str) or not SIGNATURE.fullmatch(value):
        return "expected 1-64 lowercase ASCII letters, digits, '_', ':', '.' or '-'"
    if value.startswith("xid:") and not XID_SIGNATURE.fullmatch(value):
        return "expected ASCII digits after 'xid:'"
    return None


def _event_id(value):
    if not isinstance(value, str) or not EVENT_ID.fullmatch(value):
        return "expected a UUID string (8-4-4-4-12 hexadecimal digits)"
    return None


# frame type -> {field: (checker, required)}. Optional fields may also be null.
HELLO_GPU = {
    "index": (_integer_in(0, GPU_INDEX_MAX), True),
    "uuid": (_text(80, required=True), True),
    "name": (_text(96), False),
    "serial": (_text(64), False),
    "pci_bus_id": (_text(32), False),
    "memory_total_bytes": (_integer, False),
}
SAMPLE_GPU = {
    "uuid": (_text(80, required=True), True),
    **{
        field: (_number, False)
        for field in ("util_pct", "mem_util_pct", "mem_used_bytes", "temp_c", "power_w",
                      "sm_clock_mhz", "pcie_tx_bps", "pcie_rx_bps",
                      # GPU activity (NVML's GPM, Hopper and later; issue 27), percent
                      "gr_engine_active_pct", "sm_active_pct", "sm_occupancy_pct",
                      "tensor_active_pct", "dram_active_pct")
    },
    "clock_event_reasons": (_integer, False),
    "ecc_dbe_volatile": (_integer, False),
}
SAMPLE_NODE = {
    field: (_number, False) for field in ("cpu_pct", "mem_used_bytes", "net_rx_bps", "net_tx_bps")
}
SLURM = {"state": (_text(64), False), "reason": (_free_text(500), False)}
_count = _integer_in(0, INT64_MAX)
# sample.hygiene (optional; issue 17): the agent's latest node-hygiene readings on a Slurm
# node, sent in a sample when they change and at least every minute, not in every sample.
# The server keeps the latest with the node's live entry (nodes.live_store).
HYGIENE = {
    "slurmd": ({
        "state": (_text(16), False),  # running, stopped, restarting
        "pid": (_count, False),
        "since": (_number, False),  # Unix seconds: when this slurmd started
        "restarts": (_count, False),  # by this agent run
        "last_restart_at": (_number, False),
        "watched_by": (_text(16), False),  # systemd, process
        "restart": (_boolean, False),  # whether the agent restarts a dead slurmd
    }, False),
    "processes": ({
        "zombies": (_count, False),
        "orphans": (_count, False),  # of ended jobs: re-parented to init, no job of their user
        "tasks": (_count, False),  # against pid_max (threads count)
        "pid_max": (_count, False),
        "checked_at": (_number, False),
    }, False),
    "gres": ({
        "match": (_boolean, False),  # null: not compared (why: not_compared; MIG mode)
        "not_compared": (_free_text(200), False),
        "nvml_gpus": (_count, False),
        "slurm_gpus": (_count, False),
        "checked_at": (_number, False),
    }, False),
}

FRAMES = {
    "hello": {
        "node": (_node_name, True),
        "boot_id": (_text(64, required=True), True),
        "agent_version": (_text(32), True),
        "driver_version": (_text(32), False),
        "cuda_version": (_text(32), False),
        "gpus": ([HELLO_GPU], True),
        "slurm": (SLURM, False),
        "outbox_dropped": (_integer_in(0, INT64_MAX), False),
    },
    "sample": {
        "seq": (_integer, True),
        "ts": (_number, True),
        "gpus": ([SAMPLE_GPU], True),
        "node": (SAMPLE_NODE, False),
        "hygiene": (HYGIENE, False),
    },
    "event": {
        "id": (_event_id, True),
        "ts": (_number, True),
        "signature": (_signature, True),
        "severity": (_one_of("info", "warning", "critical"), True),
        "message": (_free_text(1000), True),
        "gpu_uuid": (_text(80), False),
        "state": (_one_of("active", "cleared"), False),
        "count": (_integer_in(1, COUNT_MAX), False),
        "detail": (_detail, False),
    },
    "check_result": {
        "run_id": (_integer, True),
        "status": (_one_of("passed", "failed", "error"), True),
        "metrics": (_detail, False),
        "message": (_free_text(1000), False),
    },
    "command_result": {
        "id": (_integer, True),
        "status": (_one_of("accepted", "ok", "failed"), True),
        "message": (_free_text(1000), False),
    },
    "script_result": {
        "script_id": (_integer, True),
        "version": (_integer, False),
        "event": (_one_of("node_boot", "job_start", "job_end"), True),
        "job_id": (_text(64), False),
        "exit_code": (_integer, "present"),
        "duration_s": (_number, True),
        "output_tail": (_free_text(4096, keep="end"), False),
        "timed_out": (_boolean, False),
        "ts": (_number, False),
    },
}


def _check_fields(obj, schema, path):
    if not isinstance(obj, dict):
        raise BadFrame(f"{path}: expected an object")
    for field, (kind, required) in schema.items():
        if field not in obj:
            if required:
                raise BadFrame(f"{path}.{field}: required")
            continue
        value = obj[field]
        if value is None:
            if required is True:
                raise BadFrame(f"{path}.{field}: required, got null")
            continue  # optional fields, and "present" ones (exit_code), may be null
        if isinstance(kind, list):
            if not isinstance(value, list):
                raise BadFrame(f"{path}.{field}: expected a list")
            for i, item in enumerate(value):
                _check_fields(item, kind[0], f"{path}.{field}[{i}]")
        elif isinstance(kind, dict):
            _check_fields(value, kind, f"{path}.{field}")
        else:
            if hasattr(kind, "truncate_strings_at") and isinstance(value, dict):
                value = obj[field] = _strings_truncated(value, kind.truncate_strings_at)
            error = kind(value)
            if error:
                raise BadFrame(f"{path}.{field}: {error}")
            if hasattr(kind, "truncate_at"):
                obj[field] = truncated(value, kind.truncate_at, keep=kind.keep)


def _strings_truncated(value, limit):
    if isinstance(value, str):
        return truncated(value, limit)
    if isinstance(value, dict):
        return {key: _strings_truncated(item, limit) for key, item in value.items()}
    if isinstance(value, list):
        return [_strings_truncated(item, limit) for item in value]
    return value


def _value_problem(value):
    if isinstance(value, str):
        if BAD_CHARACTER.search(value):
            return "a string with NUL or a lone surrogate (not valid Unicode text)"
    elif isinstance(value, float):
        if not math.isfinite(value):
            return "a number that is not finite"
    elif isinstance(value, int) and not isinstance(value, bool):
        if not INT64_MIN <= value <= INT64_MAX:
            return "an integer beyond 64 bits"
    return None


# Where a frame's text may hold a string (or key) that _check_values refuses: a NUL or a
# lone surrogate, raw or escaped. A frame's text without either (nearly all) is not walked
# for them, and its numbers are checked as they are read (exact_frame).
_MAY_HOLD_A_BAD_CHARACTER = re.compile(r"\\u(?:0000|[dD][89a-fA-F])|[\x00\ud800-\udfff]")


def _check_values(frame, path):
    """Every string (keys too), number and integer anywhere in the frame, against the
    Limits that hold for all of them; BadFrame naming the first that breaks one."""
    stack = [(frame, path)]
    while stack:
        value, where = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                key_where = f"{where}.{key[:40]}"
                problem = _value_problem(key)
                if problem:
                    raise BadFrame(f"{key_where}: a key with NUL or a lone surrogate")
                stack.append((item, key_where))
        elif isinstance(value, list):
            stack.extend((item, f"{where}[{i}]") for i, item in enumerate(value))
        else:
            problem = _value_problem(value)
            if problem:
                raise BadFrame(f"{where}: {problem}")


def _check_unique(items, fields, path):
    for field in fields:
        seen = set()
        for i, item in enumerate(items):
            if item[field] in seen:
                raise BadFrame(f"{path}[{i}].{field}: {item[field]!r} appears twice")
            seen.add(item[field])


def _refuse_constant(name):
    raise ValueError(f"{name} is not JSON")


# The sample fast path: msgspec decodes a sample and checks it against these types in one
# pass. They are the protocol's sample fields only, each of its type, so whatever else a
# sample holds (a field this server does not know, `hygiene`) goes the exact way, as does a
# NUL ("\\u0000" in the text), which msgspec takes and the exact way refuses. So does a
# reading beyond READING_MAX, which PROTOCOL.md lets through but which is no measurement:
# the live store never holds one (as_fast_sample), and adds up what it holds unchecked.
_Int64 = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]
_Reading = Union[Annotated[int, msgspec.Meta(ge=-int(READING_MAX), le=int(READING_MAX))],
                 Annotated[float, msgspec.Meta(ge=-READING_MAX, le=READING_MAX)], None]
_FAST_KINDS = {_number: _Reading, _integer: Optional[_Int64]}
# A GPU's and a node's readings hold numbers and strings only: the garbage collector need
# not track them (gc=False), and does not, at thousands a second.
_SampleGpu = msgspec.defstruct(
    "SampleGpu",
    [("uuid", Annotated[str, msgspec.Meta(min_length=1, max_length=80)])]
    + [(field, _FAST_KINDS[kind], None) for field, (kind, _) in SAMPLE_GPU.items()
       if field != "uuid"],
    forbid_unknown_fields=True, gc=False)
_SampleNode = msgspec.defstruct(
    "SampleNode", [(field, _FAST_KINDS[kind], None) for field, (kind, _) in SAMPLE_NODE.items()],
    forbid_unknown_fields=True, gc=False)
FastSample = msgspec.defstruct(
    "FastSample",
    [("type", Literal["sample"]), ("seq", _Int64), ("ts", Union[_Int64, float]),
     ("gpus", list[_SampleGpu]), ("node", Optional[_SampleNode], None)],
    forbid_unknown_fields=True)
_sample_decoder = msgspec.json.Decoder(FastSample)
_NO_NODE_READINGS = _SampleNode()


@dataclass(frozen=True)
class QuickRead:
    """A frame as orjson reads it, unchecked: enough for the rate limits to refuse it
    without reading it exactly. `kind` and `event_id` are None where they cannot be told
    (the event id unless a UUID string as PROTOCOL.md has them)."""

    kind: str | None = None
    event_id: str | None = None


def quick_read(text):
    if not isinstance(text, str):
        return QuickRead()
    try:
        decoded = orjson.loads(text)
    except orjson.JSONDecodeError:
        return QuickRead()  # the standard library says why (or reads what orjson refuses)
    if type(decoded) is not dict or type(decoded.get("type")) is not str:
        return QuickRead()
    event_id = decoded.get("id") if decoded["type"] == "event" else None
    return QuickRead(decoded["type"], event_id if _event_id(event_id) is None else None)


def fast_sample(text):
    """The sample as a FastSample (its fields as attributes, each present: None where the
    agent had no reading) when `text` is a sample the fast path takes; None otherwise."""
    if not isinstance(text, str) or "\\u0000" in text:
        return None
    try:
        return _sample_decoder.decode(text)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def parse_frame(text):
    """A validated frame dict from one WebSocket text message, or BadFrame."""
    sample = fast_sample(text)
    return msgspec.to_builtins(sample) if sample is not None else exact_frame(text)


def exact_frame(text):
    """parse_frame() without the sample fast path: for a frame that did not take it."""
    if isinstance(text, (bytes, bytearray)):
        raise BadFrame("binary frames are not part of the protocol: send JSON text")
    beyond = []  # numbers read that no frame may hold; _check_values says where

    def parse_int(digits):
        value = int(digits)
        if not INT64_MIN <= value <= INT64_MAX:
            beyond.append(value)
        return value

    def parse_float(digits):
        value = float(digits)
        if not math.isfinite(value):
            beyond.append(value)
        return value

    try:
        frame = json.loads(text, parse_constant=_refuse_constant, parse_int=parse_int,
                           parse_float=parse_float)
    except ValueError as exc:
        raise BadFrame(f"not JSON: {exc}") from None
    except RecursionError:
        raise BadFrame("not JSON this server reads: nested too deeply") from None
    if not isinstance(frame, dict):
        raise BadFrame("a frame must be a JSON object")
    frame_type = frame.get("type")
    if not isinstance(frame_type, str):
        raise BadFrame("type: required, a string")
    schema = FRAMES.get(frame_type)
    if schema is None:
        raise BadFrame(f"type: unknown frame type {truncated(frame_type, 40)!r}")
    try:
        try:
            if beyond or _MAY_HOLD_A_BAD_CHARACTER.search(text):
                _check_values(frame, frame_type)
            _check_fields(frame, schema, frame_type)
            if frame_type == "hello":
                _check_unique(frame["gpus"], ("index", "uuid"), "hello.gpus")
        except RecursionError:  # a detail nested near the decoder's own depth limit
            raise BadFrame(f"{frame_type}: nested too deeply") from None
    except BadFrame as exc:
        if frame_type == "event" and _event_id(frame.get("id")) is None:
            exc.event_id = frame["id"]
        raise
    return frame


def known_hygiene(hygiene):
    """A sample's `hygiene`, its protocol fields only; None when it has none."""
    if not hygiene:
        return None
    kept = {}
    for part, (fields, _) in HYGIENE.items():
        if hygiene.get(part) is not None:
            kept[part] = {field: hygiene[part].get(field) for field in fields}
    return kept


def live_sample(frame, *, node_id, received_at, memory_totals, hygiene=None):
    """What the live store takes of a sample (nodes.live_fold.LiveSample): a FastSample's
    readings as they are, or an exact_frame() sample's protocol fields made into one (a
    sample may carry fields this server does not know, of any size: PROTOCOL.md has a
    receiver ignore them). `memory_totals`: the hello's, by GPU uuid; `hygiene`: the
    connection's latest known_hygiene(), which only some samples carry."""
    if not isinstance(frame, FastSample):
        frame = as_fast_sample(frame)
    return LiveSample(node_id, received_at, frame.seq, frame.ts, frame.gpus,
                      [memory_totals.get(gpu.uuid) for gpu in frame.gpus],
                      frame.node if frame.node is not None else _NO_NODE_READINGS, hygiene)


def as_fast_sample(frame):
    """An exact_frame() sample as a FastSample: its protocol fields, which exact_frame()
    has held to the same types and limits as the fast path's, and a reading beyond
    READING_MAX as no reading."""
    node = frame.get("node")
    return msgspec.convert({
        "type": "sample", "seq": frame["seq"], "ts": frame["ts"],
        "gpus": [_known_fields(gpu, SAMPLE_GPU) for gpu in frame["gpus"]],
        "node": None if node is None else _known_fields(node, SAMPLE_NODE),
    }, FastSample)


def _known_fields(readings, schema):
    return {field: reading(readings.get(field)) if kind is _number else readings.get(field)
            for field, (kind, _) in schema.items()}
