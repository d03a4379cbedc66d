"""PROTOCOL.md's Limits table, row by row, in the parser: what breaks a limit is refused
naming the field (an event with its id, so the agent drops it), free text over its limit is
cut and kept."""

import json

import pytest

from gateway.protocol import BadFrame, parse_frame

from .test_protocol import EVENT, HELLO, SAMPLE, SCRIPT

EVENT_ID = EVENT["id"]


def refused(frame_or_text):
    text = frame_or_text if isinstance(frame_or_text, str) else json.dumps(frame_or_text)
    with pytest.raises(BadFrame) as caught:
        parse_frame(text)
    assert caught.value.code == "bad_message"
    return caught.value


def with_gpu(frame, **fields):
    return {**frame, "gpus": [{**frame["gpus"][0], **fields}]}


@pytest.mark.parametrize("frame, field", [
    ({**HELLO, "node": "n" * 64}, "hello.node"),
    ({**HELLO, "boot_id": "b" * 65}, "hello.boot_id"),
    ({**HELLO, "agent_version": "1" * 33}, "hello.agent_version"),
    ({**HELLO, "driver_version": "5" * 33}, "hello.driver_version"),
    ({**HELLO, "cuda_version": "1" * 33}, "hello.cuda_version"),
    (with_gpu(HELLO, uuid="G" * 81), "hello.gpus[0].uuid"),
    (with_gpu(HELLO, pci_bus_id="0" * 33), "hello.gpus[0].pci_bus_id"),
    (with_gpu(HELLO, name="N" * 97), "hello.gpus[0].name"),
    ({**HELLO, "slurm": {"state": "S" * 65, "reason": None}}, "hello.slurm.state"),
    (with_gpu(SAMPLE, uuid="G" * 81), "sample.gpus[0].uuid"),
    ({**SCRIPT, "job_id": "9" * 65}, "script_result.job_id"),
])
def test_an_identifier_over_its_length_is_refused(frame, field):
    assert refused(frame).message.startswith(f"{field}: ")


def test_identifiers_at_their_limits_are_taken():
    frame = with_gpu({**HELLO, "node": "n" * 63, "boot_id": "b" * 64, "agent_version": "1" * 32},
                     uuid="G" * 80, pci_bus_id="0" * 32, name="N" * 96, index=1023)
    assert parse_frame(json.dumps(frame)) == frame


@pytest.mark.parametrize("signature", [
    "xid:\u0667\u0669",  # Arabic-Indic digits: str.isdigit() says yes, int() reads 79
    "xid:79x", "xid:", "xid:-1", "Xid:79", "thermal throttle", "gpu_lost\n", "s" * 65, "",
    "sig\u00e9",
])
def test_a_signature_outside_its_alphabet_is_refused_with_the_event_id(signature):
    error = refused({**EVENT, "signature": signature})
    assert error.message.startswith("event.signature: ") and error.event_id == EVENT_ID


@pytest.mark.parametrize("signature", ["xid:79", "xid:0", "gpu_lost", "check:gpu_compute",
                                       "vendor.fabric-link:3", "s" * 64])
def test_signatures_of_the_protocols_alphabet_are_taken(signature):
    assert parse_frame(json.dumps({**EVENT, "signature": signature}))["signature"] == signature


@pytest.mark.parametrize("name", ["gpu-1\n", "-gpu", "_gpu", ".gpu", "gpu 1", "gpü", ""])
def test_a_node_name_is_a_name(name):
    assert refused({**HELLO, "node": name}).message.startswith("hello.node: ")


def test_free_text_over_its_limit_is_cut_and_kept():
    long = "é" * 5000
    event = parse_frame(json.dumps({**EVENT, "message": long,
                                    "detail": {"line": long, "lines": [long, "ok"], "n": 1}}))
    assert event["message"] == "é" * 999 + "…"
    assert event["detail"] == {"line": "é" * 999 + "…", "lines": ["é" * 999 + "…", "ok"], "n": 1}
    hello = parse_frame(json.dumps({**HELLO, "slurm": {"state": "DRAIN", "reason": long}}))
    assert hello["slurm"]["reason"] == "é" * 499 + "…"
    script = parse_frame(json.dumps({**SCRIPT, "output_tail": "start" + "x" * 5000 + "end"}))
    assert len(script["output_tail"]) == 4096
    assert script["output_tail"].startswith("…x") and script["output_tail"].endswith("xend")
    for frame in ({"type": "check_result", "run_id": 1, "status": "error", "message": long},
                  {"type": "command_result", "id": 1, "status": "failed", "message": long}):
        assert len(parse_frame(json.dumps(frame))["message"]) == 1000


def test_free_text_at_its_limit_is_left_alone():
    assert parse_frame(json.dumps({**EVENT, "message": "m" * 1000}))["message"] == "m" * 1000


def test_a_detail_over_16_kib_is_refused_with_the_event_id():
    detail = {f"k{i}": "v" * 900 for i in range(20)}  # each string fits; the whole does not
    error = refused({**EVENT, "detail": detail})
    assert error.message.startswith("event.detail: expected at most 16384 bytes")
    assert error.event_id == EVENT_ID
    assert "metrics" in refused({"type": "check_result", "run_id": 1, "status": "passed",
                                 "metrics": detail}).message


@pytest.mark.parametrize("bad", ["a\u0000b", "\ud800", "x\udfffy"])
@pytest.mark.parametrize("place", ["message", "detail value", "detail key", "gpu_uuid"])
def test_a_string_that_is_not_text_is_refused_with_the_event_id(bad, place):
    if place == "message":
        frame = {**EVENT, "message": bad}
    elif place == "detail value":
        frame = {**EVENT, "detail": {"nested": [{"line": bad}]}}
    elif place == "detail key":
        frame = {**EVENT, "detail": {bad: 1}}
    else:
        frame = {**EVENT, "gpu_uuid": bad}
    error = refused(json.dumps(frame))  # ensure_ascii: the surrogate goes as an escape
    assert "NUL or a lone surrogate" in error.message and error.event_id == EVENT_ID


@pytest.mark.parametrize("frame", [
    {**HELLO, "boot_id": "b\u0000"},
    with_gpu(HELLO, name="H200\ud83d"),
    with_gpu(SAMPLE, uuid="GPU-dd6e\u0000"),
    {**SAMPLE, "unknown_field": "\u0000"},  # not stored, but not text either
    {**SCRIPT, "output_tail": "\ud800"},
])
def test_no_frame_type_takes_a_string_that_is_not_text(frame):
    assert "NUL or a lone surrogate" in refused(frame).message


@pytest.mark.parametrize("text, field", [
    (json.dumps(EVENT).replace('"ts": 1764442001.5', '"ts": 1e400'), "event.ts"),
    (json.dumps({**EVENT, "detail": {"x": 1}}).replace('"x": 1', '"x": -1e999'), "event.detail.x"),
    (json.dumps(SAMPLE).replace('"power_w": 690.4', '"power_w": 1e400'), "sample.gpus[0].power_w"),
    (json.dumps({**SAMPLE, "seq": 2 ** 63}), "sample.seq"),
    (json.dumps({**SAMPLE, "seq": -2 ** 63 - 1}), "sample.seq"),
    (json.dumps(with_gpu(SAMPLE, temp_c=2 ** 64)), "sample.gpus[0].temp_c"),
    (json.dumps(with_gpu(SAMPLE, mem_used_bytes=10 ** 30)), "sample.gpus[0].mem_used_bytes"),
    (json.dumps(with_gpu(HELLO, memory_total_bytes=2 ** 64)), "hello.gpus[0].memory_total_bytes"),
    (json.dumps({**SCRIPT, "exit_code": 2 ** 70}), "script_result.exit_code"),
    (json.dumps({"type": "check_result", "run_id": 2 ** 63, "status": "passed"}),
     "check_result.run_id"),
])
def test_a_number_that_is_not_finite_or_an_integer_beyond_64_bits_is_refused(text, field):
    assert refused(text).message.startswith(f"{field}: ")


def test_an_event_with_a_number_it_cannot_hold_is_refused_with_its_id():
    error = refused(json.dumps(EVENT).replace('"ts": 1764442001.5', '"ts": 1e400'))
    assert error.event_id == EVENT_ID


@pytest.mark.parametrize("frame, field", [
    (with_gpu(HELLO, index=1024), "hello.gpus[0].index"),
    (with_gpu(HELLO, index=-1), "hello.gpus[0].index"),
    ({**EVENT, "count": 2 ** 31}, "event.count"),
    ({**EVENT, "count": 0}, "event.count"),
])
def test_integers_with_a_range_of_their_own_are_held_to_it(frame, field):
    assert refused(frame).message.startswith(f"{field}: expected an integer from")


def test_integers_at_64_bits_and_counts_at_their_limit_are_taken():
    assert parse_frame(json.dumps({**SAMPLE, "seq": 2 ** 63 - 1}))["seq"] == 2 ** 63 - 1
    assert parse_frame(json.dumps({**SAMPLE, "seq": -2 ** 63}))["seq"] == -2 ** 63
    assert parse_frame(json.dumps({**EVENT, "count": 2 ** 31 - 1}))["count"] == 2 ** 31 - 1


@pytest.mark.parametrize("event_id", ["{0b9e6f0e-2d7c-4a8e-9a41-3c2f1d1f3a10}",
                                      "urn:uuid:0b9e6f0e-2d7c-4a8e-9a41-3c2f1d1f3a10",
                                      "0b9e6f0e2d7c4a8e9a413c2f1d1f3a10",
                                      "0b9e6f0e-2d7c-4a8e-9a41-3c2f1d1f3a1\u0660"])
def test_an_event_id_is_a_uuid_string_in_its_one_form(event_id):
    error = refused({**EVENT, "id": event_id})
    assert error.message.startswith("event.id: ") and error.event_id is None


def test_an_upper_case_event_id_is_a_uuid_too():
    assert parse_frame(json.dumps({**EVENT, "id": EVENT_ID.upper()}))["id"] == EVENT_ID.upper()


@pytest.mark.parametrize("text", [
    "[" * 100_000 + "]" * 100_000,
    json.dumps({**EVENT, "detail": {"d": "@"}}).replace('"@"', "[" * 980 + "]" * 980),
])
def test_nesting_past_what_the_server_reads_is_a_bad_frame(text):
    assert "nested too deeply" in refused(text).message
