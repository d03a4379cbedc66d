import json

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.protocol import (
    FRAMES,
    SAMPLE_GPU,
    SAMPLE_NODE,
    BadFrame,
    _check_fields,
    _check_values,
    fast_sample,
    live_sample,
    parse_frame,
)

HELLO = {"type": "hello", "node": "gpu-001", "boot_id": "4f1c", "agent_version": "1.0.0",
         "driver_version": "580.159.04", "cuda_version": "13.0",
         "gpus": [{"index": 0, "uuid": "GPU-dd6e", "name": "NVIDIA H200",
                   "pci_bus_id": "00000000:00:06.0", "memory_total_bytes": 150754820096}],
         "slurm": {"state": "IDLE", "reason": None}}
SAMPLE = {"type": "sample", "seq": 812, "ts": 1764442000.123,
          "gpus": [{"uuid": "GPU-dd6e", "util_pct": 100, "mem_util_pct": 24,
                    "mem_used_bytes": 1703936000, "temp_c": 55, "power_w": 690.4,
                    "sm_clock_mhz": 1470, "clock_event_reasons": 4, "ecc_dbe_volatile": 0,
                    "pcie_tx_bps": 7200000, "pcie_rx_bps": 650000,
                    # the optional GPU activity fields (NVML's GPM; issue 27)
                    "gr_engine_active_pct": 99.5, "sm_active_pct": 96.8,
                    "sm_occupancy_pct": 47.5, "tensor_active_pct": 83.2,
                    "dram_active_pct": 38.4}],
          "node": {"cpu_pct": 12.5, "mem_used_bytes": 51234567890, "net_rx_bps": 1.2e9,
                   "net_tx_bps": 9.1e8}}
EVENT = {"type": "event", "id": "0b9e6f0e-2d7c-4a8e-9a41-3c2f1d1f3a10", "ts": 1764442001.5,
         "signature": "xid:79", "gpu_uuid": "GPU-dd6e", "severity": "critical",
         "message": "GPU has fallen off the bus", "detail": {"xid": 79, "source": "nvml"}}
SCRIPT = {"type": "script_result", "script_id": 3, "version": 7, "event": "job_start",
          "job_id": "48213", "exit_code": 0, "duration_s": 1.24, "output_tail": "...",
          "ts": 1764442003.0}
VALID = [HELLO, SAMPLE, EVENT, SCRIPT,
         {"type": "check_result", "run_id": 57, "status": "passed", "metrics": {"tflops": 712.3},
          "message": ""},
         {"type": "command_result", "id": 91, "status": "ok", "message": ""}]


@pytest.mark.parametrize("frame", VALID, ids=lambda f: f["type"])
def test_the_protocols_own_examples_are_valid(frame):
    assert parse_frame(json.dumps(frame)) == frame


def test_a_sample_without_the_activity_fields_reads_them_as_null():
    """An agent from before GPM (PROTOCOL.md's own sample example) sends none of them."""
    activity = ("gr_engine_active_pct", "sm_active_pct", "sm_occupancy_pct",
                "tensor_active_pct", "dram_active_pct")
    older = json.loads(json.dumps(SAMPLE))
    for field in activity:
        del older["gpus"][0][field]
    assert parse_frame(json.dumps(older))["gpus"][0] == {**older["gpus"][0],
                                                         **dict.fromkeys(activity)}


def test_unknown_fields_are_ignored():
    assert parse_frame(json.dumps({**SAMPLE, "future_field": [1, 2]}))["seq"] == 812


@pytest.mark.parametrize("extra", [
    {"future_field": 2 ** 64},  # orjson and msgspec read it; the protocol holds 64 bits
    {"future_field": "a\u0000b"},
    {"future\u0000field": 1},
    {"hygiene": {"processes": {"zombies": -1}}},
])
def test_what_the_sample_fast_path_cannot_vouch_for_is_read_exactly(extra):
    text = json.dumps({**SAMPLE, **extra})
    assert fast_sample(text) is None
    with pytest.raises(BadFrame):
        parse_frame(text)


def test_the_sample_fast_path_reads_a_sample_with_every_field_present():
    frame = fast_sample(json.dumps({"type": "sample", "seq": 0, "ts": 1,
                                    "gpus": [{"uuid": "GPU-dd6e", "temp_c": 40}]}))
    assert frame.node is None
    assert msgspec.to_builtins(frame.gpus[0]) == {field: None for field in SAMPLE_GPU} | {
        "uuid": "GPU-dd6e", "temp_c": 40}


@pytest.mark.parametrize("value", [1e300, -2e18, 2 * 10 ** 18])
def test_a_reading_beyond_reading_max_is_valid_and_the_live_store_takes_it_as_none(value):
    """PROTOCOL.md lets any finite number through; the live store adds up what it holds
    unchecked, so it holds no reading beyond READING_MAX (nodes/rollups.py)."""
    gpu = {**SAMPLE["gpus"][0], "temp_c": value}
    text = json.dumps({**SAMPLE, "gpus": [gpu], "node": {"cpu_pct": value, "net_rx_bps": 5}})
    assert fast_sample(text) is None
    frame = parse_frame(text)
    assert frame["gpus"][0]["temp_c"] == value and frame["node"]["cpu_pct"] == value
    kept = live_sample(frame, node_id=1, received_at=1.0, memory_totals={"GPU-dd6e": 10})
    assert kept.gpus[0].temp_c is None and kept.gpus[0].power_w == 690.4
    assert kept.node.cpu_pct is None and kept.node.net_rx_bps == 5
    assert kept.gpus[0].clock_event_reasons == 4  # a bitmask, not a reading


def test_optional_fields_may_be_null_or_absent():
    gpu = {"uuid": "GPU-dd6e", "temp_c": None, "power_w": None}
    parse_frame(json.dumps({"type": "sample", "seq": 0, "ts": 1, "gpus": [gpu], "node": None}))
    parse_frame(json.dumps({**EVENT, "gpu_uuid": None, "detail": None}))
    parse_frame(json.dumps({**SCRIPT, "exit_code": None, "timed_out": True}))


@pytest.mark.parametrize("text, message", [
    ("not json", "not JSON"),
    ("[1, 2]", "a frame must be a JSON object"),
    ('{"seq": 1}', "type: required"),
    ('{"type": "selfie"}', "type: unknown frame type 'selfie'"),
    (json.dumps({**SAMPLE, "gpus": [{**SAMPLE["gpus"][0], "temp_c": "55"}]}),
     "sample.gpus[0].temp_c: expected a number"),
    (json.dumps({**SAMPLE, "gpus": [{**SAMPLE["gpus"][0], "temp_c": True}]}),
     "sample.gpus[0].temp_c: expected a number"),
    (json.dumps({**SAMPLE, "seq": 812.0}), "sample.seq: expected an integer"),
    ('{"type": "sample", "seq": 1, "ts": NaN, "gpus": []}', "not JSON"),
    (json.dumps({k: v for k, v in SAMPLE.items() if k != "ts"}), "sample.ts: required"),
    (json.dumps({**SAMPLE, "gpus": {}}), "sample.gpus: expected a list"),
    (json.dumps({**SAMPLE, "gpus": [{"util_pct": 3}]}), "sample.gpus[0].uuid: required"),
    (json.dumps({**HELLO, "node": "bad name"}), "hello.node: expected 1-63 ASCII letters"),
    (json.dumps({**HELLO, "node": "x" * 64}), "hello.node: expected 1-63 ASCII letters"),
    (json.dumps({**HELLO, "gpus": [{"uuid": "GPU-1"}]}), "hello.gpus[0].index: required"),
    (json.dumps({**HELLO, "boot_id": None}), "hello.boot_id: required, got null"),
    (json.dumps({**HELLO, "gpus": [HELLO["gpus"][0], {**HELLO["gpus"][0], "uuid": "GPU-2"}]}),
     "hello.gpus[1].index: 0 appears twice"),
    (json.dumps({**HELLO, "gpus": [HELLO["gpus"][0], {**HELLO["gpus"][0], "index": 1}]}),
     "hello.gpus[1].uuid: 'GPU-dd6e' appears twice"),
    (json.dumps({**EVENT, "id": "17"}), "event.id: expected a UUID string"),
    (json.dumps({**EVENT, "severity": "fatal"}), "event.severity: expected one of"),
    (json.dumps({**EVENT, "count": 0}), "event.count: expected an integer from 1 to 2147483647"),
    (json.dumps({**EVENT, "state": "gone"}), "event.state: expected one of active, cleared"),
    (json.dumps({k: v for k, v in SCRIPT.items() if k != "exit_code"}),
     "script_result.exit_code: required"),
    (json.dumps({"type": "command_result", "id": "91", "status": "ok"}),
     "command_result.id: expected an integer"),
])
def test_a_bad_frame_is_refused_naming_the_field(text, message):
    with pytest.raises(BadFrame) as caught:
        parse_frame(text)
    assert caught.value.code == "bad_message"
    assert message in caught.value.message


def test_a_binary_frame_is_a_bad_frame():
    with pytest.raises(BadFrame, match="binary"):
        parse_frame(b'{"type": "hello"}')


def test_a_malformed_event_carries_its_id_when_it_could_be_read():
    with pytest.raises(BadFrame) as caught:
        parse_frame(json.dumps({**EVENT, "severity": "fatal"}))
    assert caught.value.event_id == EVENT["id"]
    with pytest.raises(BadFrame) as caught:
        parse_frame(json.dumps({**EVENT, "id": 5}))
    assert caught.value.event_id is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(frame_type=st.sampled_from([*[f["type"] for f in VALID], "x"]),
       base=st.sampled_from(VALID), key=st.text(max_size=20), value=json_values)
def test_random_frames_either_validate_or_raise_bad_frame(frame_type, base, key, value):
    frame = {**base, "type": frame_type, key: value}
    try:
        parsed = parse_frame(json.dumps(frame))
    except BadFrame as exc:
        assert exc.message
    else:
        assert parsed["type"] in {"hello", "sample", "event", "check_result", "command_result",
                                  "script_result"}


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64) | st.text(max_size=64))
def test_random_bytes_and_text_never_crash_the_parser(data):
    try:
        parse_frame(data)
    except BadFrame:
        pass


# A sample's fields one by one, with values of every JSON kind and integers of any size.
sample_values = (st.none() | st.booleans() | st.floats(allow_nan=False, allow_infinity=False)
                 | st.integers() | st.integers(min_value=2**63 - 2, max_value=2**64 + 2)
                 | st.integers(min_value=-2**63 - 2, max_value=-2**63 + 2) | st.text(max_size=4))
SAMPLE_FIELDS = ([("seq",), ("ts",)]
                 + [("gpus", 0, field) for field in SAMPLE_GPU if field != "uuid"]
                 + [("node", field) for field in SAMPLE_NODE])


def exact_reading(text):
    """The sample as the standard library reads it and the schema checks it; None if invalid."""
    frame = json.loads(text)
    try:
        _check_values(frame, "sample")
        _check_fields(frame, FRAMES["sample"], "sample")
    except BadFrame:
        return None
    return frame


def value_at(frame, path):
    for key in path:
        frame = frame[key]
    return frame


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(SAMPLE_FIELDS), sample_values), max_size=4))
def test_the_sample_fast_path_reads_and_refuses_as_the_exact_path_does(changes):
    """parse_frame's orjson path accepts a sample only when the schema does, with the same
    values of the same types (an integer beyond 64 bits is refused on both)."""
    frame = json.loads(json.dumps(SAMPLE))
    for path, value in changes:
        value_at(frame, path[:-1])[path[-1]] = value
    text = json.dumps(frame)
    expected = exact_reading(text)
    if expected is None:
        with pytest.raises(BadFrame):
            parse_frame(text)
        return
    parsed = parse_frame(text)
    for path in SAMPLE_FIELDS:
        want, got = value_at(expected, path), value_at(parsed, path)
        assert type(got) is type(want) and got == want
    assert parsed == expected
