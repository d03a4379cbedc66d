import json
import uuid

import pytest

from agent import protocol


def test_encode_is_compact_json():
    frame = protocol.command_result_frame(command_id=91, status="failed", message="no")

    assert (
        protocol.encode(frame)
        == '{"type":"command_result","id":91,"status":"failed","message":"no"}'
    )


def test_a_frame_over_1_mib_is_never_encoded():
    just_fits = {"type": "event", "detail": "x" * (1024 * 1024 - 30)}
    too_big = {"type": "event", "detail": "x" * (1024 * 1024)}

    assert len(protocol.encode(just_fits)) <= 1024 * 1024
    with pytest.raises(protocol.FrameError, match="over the 1 MiB limit"):
        protocol.encode(too_big)


def test_nan_is_never_encoded():
    with pytest.raises(protocol.FrameError, match="not valid JSON"):
        protocol.encode({"type": "sample", "ts": float("nan")})


def test_event_frames_get_their_own_uuid():
    first = protocol.event_frame(
        signature="xid:79", severity="critical", message="m", gpu_uuid="GPU-1"
    )
    second = protocol.event_frame(
        signature="xid:79", severity="critical", message="m", gpu_uuid="GPU-1"
    )

    assert first["id"] != second["id"]
    assert str(uuid.UUID(first["id"])) == first["id"]
    assert json.loads(protocol.encode(first))["state"] == "active"


@pytest.mark.parametrize("options", [{"severity": "fatal"}, {"state": "gone"}])
def test_event_frames_refuse_values_the_protocol_does_not_have(options):
    settings = {"signature": "xid:79", "severity": "critical", "message": "m"} | options
    with pytest.raises(ValueError):
        protocol.event_frame(**settings)
