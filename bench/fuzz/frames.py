"""Hostile frames for the agent protocol, and the check that the server answers each.

frames() makes valid frames of one type (PROTOCOL.md's examples) with one to three fields,
nested ones too, replaced by values that break the Limits or sit right at them: long
strings, NUL, lone surrogates, digits that are not ASCII, integers past 64 bits, numbers
past a double, deep nesting, wrong types, missing and unknown fields. Seeded: a run can be
repeated.

fuzz() sends them on one agent connection after another, each followed by a normal event
(the probe), and holds the server to PROTOCOL.md: everything before the probe's ack is the
fuzzed frame's answer; no frame is answered server_error (a limit the schema missed, which
the handler then tripped on); an event is always answered (ack, or error with its id, or
bad_message when its id could not be read); the connection closes only where the protocol
says (4400 after more than 20 bad frames, 4403 for a hello naming another node). Used by
gateway/tests/test_consumer_fuzz.py (a few hundred frames) and bench/fuzz/run.py (10,000 a
type against daphne)."""

import copy
import json
import random
import time
import uuid
from dataclasses import dataclass, field

FRAME_TYPES = ("hello", "sample", "event", "check_result", "command_result", "script_result")

# Values JSON text can carry but Python's json cannot write: spliced in after encoding.
RAW = {
    "@inf@": "1e400", "@-inf@": "-1e400", "@nan@": "NaN", "@infinity@": "Infinity",
    "@deep@": "[" * 3000 + "]" * 3000, "@deep-object@": '{"a":' * 990 + "1" + "}" * 990,
    "@digits@": "9" * 5000,  # past Python's 4,300-digit limit for int()
}

STRINGS = [
    "", " ", "x" * 63, "x" * 64, "x" * 65, "x" * 80, "x" * 81, "x" * 97, "x" * 1000,
    "x" * 1001, "x" * 5000, "y" * 200_000, "\x00", "a\x00b", "\ud800", "x\udfff", "\ud83d",
    "🔥" * 300, "é" * 1001, "gpu-1\n", "-rf", "_gpu", "xid:\u0667\u0669", "xid:79", "XID:79",
    "xid:", "xid:" + "9" * 60, "xid:79\n", "../../etc/passwd", "'; DROP TABLE nodes;--",
    "=cmd|' /C calc'!A0", "<script>alert(1)</script>", "\u202egpu", "\t\r\n", "null", "0",
    "gpu_lost", "0b9e6f0e-2d7c-4a8e-9a41-3c2f1d1f3a10", "{0b9e6f0e-2d7c-4a8e-9a41-3c2f1d1f3a10}",
]
NUMBERS = [
    0, -1, 1, 1023, 1024, 2 ** 31 - 1, 2 ** 31, 2 ** 53 + 1, 2 ** 63 - 1, 2 ** 63, -2 ** 63,
    -2 ** 63 - 1, 2 ** 64, 10 ** 30, 10 ** 400, 1.5, -0.0, 1e308, -1e308, 5e-324,
    "@inf@", "@-inf@", "@nan@", "@infinity@", "@digits@", True, False, None,
]
STRUCTURES = [
    [], {}, [1, 2], {"a": {"b": [None]}}, "@deep@", "@deep-object@", {"\x00": 1},
    {"k" * 2000: 1}, {f"k{i}": "v" * 900 for i in range(20)}, [{"uuid": "\ud800"}],
    {"xid": 2 ** 64}, {"line": "z" * 3000},
]


def hostile_value(rng):
    pool = rng.choice((STRINGS, NUMBERS, STRUCTURES))
    return copy.deepcopy(rng.choice(pool))  # a later mutation may change it in place


def new_event_id(rng):
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def valid_frame(frame_type, rng, *, node, gpu_uuids):
    """A valid frame of `frame_type` for the node (PROTOCOL.md's examples)."""
    gpus = [{"index": i, "uuid": gpu_uuid, "name": "NVIDIA H200",
             "pci_bus_id": f"00000000:{i + 6:02X}:00.0", "memory_total_bytes": 150754820096}
            for i, gpu_uuid in enumerate(gpu_uuids)]
    if frame_type == "hello":
        return {"type": "hello", "node": node, "boot_id": "fuzz-boot", "agent_version": "1.0.0",
                "driver_version": "580.159.04", "cuda_version": "13.0", "gpus": gpus,
                "slurm": {"state": "IDLE", "reason": None}}
    if frame_type == "sample":
        return {"type": "sample", "seq": rng.randrange(10 ** 6), "ts": time.time(),
                "gpus": [{"uuid": gpu["uuid"], "util_pct": 100, "mem_util_pct": 24,
                          "mem_used_bytes": 1703936000, "temp_c": 55, "power_w": 690.4,
                          "sm_clock_mhz": 1470, "clock_event_reasons": 4,
                          "ecc_dbe_volatile": 0, "pcie_tx_bps": 7200000,
                          "pcie_rx_bps": 650000} for gpu in gpus],
                "node": {"cpu_pct": 12.5, "mem_used_bytes": 51234567890, "net_rx_bps": 1.2e9,
                         "net_tx_bps": 9.1e8}}
    if frame_type == "event":
        return {"type": "event", "id": new_event_id(rng), "ts": time.time(),
                "signature": rng.choice(("xid:79", "thermal_throttle", "slurm_drain")),
                "gpu_uuid": gpu_uuids[0], "severity": "warning", "message": "fuzzed",
                "detail": {"xid": 79, "source": "nvml"}, "state": "active", "count": 1}
    if frame_type == "check_result":
        return {"type": "check_result", "run_id": rng.randrange(1, 10 ** 9), "status": "passed",
                "metrics": {"tflops": 712.3}, "message": ""}
    if frame_type == "command_result":
        return {"type": "command_result", "id": rng.randrange(1, 10 ** 9), "status": "ok",
                "message": ""}
    return {"type": "script_result", "script_id": rng.randrange(1, 10 ** 9), "version": 7,
            "event": "job_start", "job_id": "48213", "exit_code": 0, "duration_s": 1.24,
            "output_tail": "...", "ts": time.time(), "timed_out": False}


def leaf_paths(value, path=()):
    """Every place in the frame a value sits, but its type."""
    if isinstance(value, dict):
        paths = [path] if path else []
        for key, item in value.items():
            if path or key != "type":
                paths += leaf_paths(item, path + (key,))
        return paths
    if isinstance(value, list):
        paths = [path]
        for i, item in enumerate(value[:2]):
            paths += leaf_paths(item, path + (i,))
        return paths
    return [path]


def mutated(frame, rng):
    """The frame with one to three values made hostile; sometimes a field dropped or added."""
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(leaf_paths(frame))
        parent = frame
        for key in path[:-1]:
            parent = parent[key]
        roll = rng.random()
        if roll < 0.08 and isinstance(parent, dict):
            parent.pop(path[-1], None)
        elif roll < 0.16:
            frame[rng.choice(("future", "\ud800", "x" * 300, "\x00"))] = hostile_value(rng)
        else:
            parent[path[-1]] = hostile_value(rng)
    return frame


def encode(frame):
    """JSON text as an agent would send it: ASCII only (a lone surrogate goes as its escape),
    with RAW's texts spliced in."""
    text = json.dumps(frame, ensure_ascii=True)
    for marker, raw in RAW.items():
        text = text.replace(json.dumps(marker), raw)
    return text


@dataclass
class Fuzzed:
    frame_type: str
    text: str
    event_id: str | None  # an event's id, when it is still a string
    node: object  # the hello's node field


def frames(frame_type, count, rng, *, node, gpu_uuids):
    for _ in range(count):
        frame = mutated(valid_frame(frame_type, rng, node=node, gpu_uuids=gpu_uuids), rng)
        event_id = frame.get("id") if frame_type == "event" else None
        yield Fuzzed(frame_type, encode(frame), event_id if isinstance(event_id, str) else None,
                     frame.get("node"))


class Closed(Exception):
    def __init__(self, code):
        super().__init__(f"closed with {code}")
        self.code = code


class Violation(AssertionError):
    """The server broke PROTOCOL.md on a fuzzed frame."""


@dataclass
class Tally:
    frames: int = 0
    probes_acked: int = 0
    answers: dict = field(default_factory=dict)  # answer kind -> count
    closes: dict = field(default_factory=dict)  # close code -> count
    connections: int = 0

    def count(self, table, key):
        table[key] = table.get(key, 0) + 1


def answer_kind(frame):
    if frame.get("type") == "error":
        return f"error:{frame.get('code')}"
    return frame.get("type", "?")


async def fuzz(open_connection, frame_type, count, *, seed, node, gpu_uuids, tally=None):
    """Send `count` fuzzed frames of `frame_type`, each with a probe after it. `open_connection`
    is an async function giving a connection that has said hello and read its welcome and
    config: send(text) and receive() (a frame dict, or raises Closed), close(). Raises
    Violation, with the frame, on the first breach of the protocol."""
    rng = random.Random(seed)
    tally = tally or Tally()
    connection = None
    bad_answers = []  # monotonic times of bad_message answers on this connection
    for fuzzed in frames(frame_type, count, rng, node=node, gpu_uuids=gpu_uuids):
        if connection is None:
            connection = await open_connection()
            tally.connections += 1
            bad_answers = []
        probe = valid_frame("event", rng, node=node, gpu_uuids=gpu_uuids)
        probe["signature"], probe["message"] = "fuzz_probe", "the frame before was answered"
        tally.frames += 1
        try:
            await connection.send(fuzzed.text)
            await connection.send(json.dumps(probe))
            answers = await _answers_until_probe(connection, probe["id"], fuzzed)
        except Closed as closed:
            tally.count(tally.closes, closed.code)
            _check_close(closed.code, fuzzed, node, bad_answers)
            connection = None
            continue
        tally.probes_acked += 1
        for answer in answers:
            tally.count(tally.answers, answer_kind(answer))
            if answer.get("code") == "bad_message":
                bad_answers.append(time.monotonic())
        _check_answers(fuzzed, answers)
    if connection is not None:
        await connection.close()
    return tally


async def _answers_until_probe(connection, probe_id, fuzzed):
    answers = []
    while True:
        frame = await connection.receive()
        if frame.get("type") == "ack" and probe_id in frame.get("ids", ()):
            return answers
        if frame.get("retry_id") == probe_id or frame.get("id") == probe_id:
            raise Violation(f"the probe after a fuzzed frame was not acked: {frame}\n"
                            f"fuzzed: {fuzzed.text[:2000]}")
        answers.append(frame)


def _check_answers(fuzzed, answers):
    where = f"\nfuzzed {fuzzed.frame_type}: {fuzzed.text[:2000]}"
    for answer in answers:
        if answer.get("code") == "server_error":
            raise Violation(f"answered server_error: {answer}{where}")
    if fuzzed.frame_type != "event":
        return
    answered = [a for a in answers
                if (a.get("type") == "ack" and fuzzed.event_id in a.get("ids", ()))
                or (a.get("type") == "error" and (a.get("id") == fuzzed.event_id
                                                  or a.get("retry_id") == fuzzed.event_id
                                                  or "id" not in a))]
    if not answered:
        raise Violation(f"an event got no answer: {answers}{where}")


def _check_close(code, fuzzed, node, bad_answers):
    where = f"\nfuzzed {fuzzed.frame_type}: {fuzzed.text[:2000]}"
    if code == 4400:
        recent = [t for t in bad_answers if t > time.monotonic() - 60]
        if len(recent) >= 20:  # the 21st bad frame may close before its answer
            return
        raise Violation(f"closed 4400 after only {len(recent)} bad frames{where}")
    if code == 4403 and fuzzed.frame_type == "hello" and fuzzed.node != node:
        return  # a hello naming another node than the token's
    raise Violation(f"closed with {code}{where}")
