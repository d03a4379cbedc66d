import json
import uuid

import pytest

from agent.connection import protocol


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


def test_free_text_is_cut_to_the_protocols_limits():
    long = "x" * 5000
    event = protocol.event_frame(signature="slurm_drain", severity="warning", message=long,
                                 detail={"reason": long, "lines": [long], "n": 3})
    assert len(event["message"]) == 1000 and event["message"].endswith("…")
    assert len(event["detail"]["reason"]) == 1000 and len(event["detail"]["lines"][0]) == 1000
    assert event["detail"]["n"] == 3
    hello = protocol.hello_frame(node="gpu-1", boot_id="b", agent_version="1", driver_version="",
                                 cuda_version="", gpus=[],
                                 slurm={"state": "DRAIN", "reason": long})
    assert len(hello["slurm"]["reason"]) == 500 and hello["slurm"]["state"] == "DRAIN"
    assert protocol.hello_frame(node="gpu-1", boot_id="b", agent_version="1", driver_version="",
                                cuda_version="", gpus=[], slurm=None)["slurm"] is None
    assert len(protocol.command_result_frame(command_id=1, status="failed",
                                             message=long)["message"]) == 1000
    assert len(protocol.check_result_frame(run_id=1, status="error",
                                           message=long)["message"]) == 1000
    short = protocol.event_frame(signature="x", severity="info", message="fits")
    assert short["message"] == "fits"
