"""The agent WebSocket against PROTOCOL.md: every row of its error table, and the happy path."""

import asyncio
import json
import threading
import uuid
from datetime import timedelta

import pytest
import pytest_asyncio
import uvloop
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.utils import timezone
from hypothesis import HealthCheck, given, settings as hypothesis_settings
from hypothesis import strategies as st

from clusterui.asgi import application
from clusters.models import AuditEntry
from healthchecks.models import HealthEvent
from gateway import ingest
from nodes.models import AgentToken, Node, NodeTransition
from nodes.services import do_issue_join_token, do_open_rejoin, do_revoke_agent_token
from gateway.tests.gateway_client import GatewayCommunicator, serving_gateway

# Every test runs against both servers of the agent socket, each on the loop it serves on
# (conftest.py).
pytestmark = [pytest.mark.asyncio(loop_factories=["channels", "gateway"]),
              pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("in_memory_channel_layer")]

GPUS = [{"index": i, "uuid": f"GPU-{i:04d}", "name": "NVIDIA H200",
         "pci_bus_id": f"00000000:{i + 6:02X}:00.0", "memory_total_bytes": 150754820096}
        for i in range(8)]


def hello(node="gpu-001", boot_id="boot-1", gpus=GPUS, **extra):
    return {"type": "hello", "node": node, "boot_id": boot_id, "agent_version": "1.0.0",
            "driver_version": "580.159.04", "cuda_version": "13.0", "gpus": gpus, "slurm": None,
            **extra}


def sample(seq=0, uuids=("GPU-0000",)):
    return {"type": "sample", "seq": seq, "ts": 1764442000.0,
            "gpus": [{"uuid": u, "util_pct": 100, "temp_c": 55} for u in uuids]}


def event(signature="xid:79", **extra):
    return {"type": "event", "id": str(uuid.uuid4()), "ts": 1764442001.5,
            "signature": signature, "gpu_uuid": "GPU-0003", "severity": "critical",
            "message": "GPU has fallen off the bus", "detail": {"xid": 79, "source": "nvml"},
            **extra}


# Where connect() goes: None, AgentConsumer in this process through Channels' test
# communicator (what daphne serves); or the URL of the agent gateway's server
# (gateway/server.py) on a loopback port, over a real socket (the `served_by` fixture).
GATEWAY_URL = None


@pytest_asyncio.fixture(autouse=True)
async def served_by():
    """The server of this run (pytestmark): the gateway's on uvloop, Channels' on asyncio's
    loop."""
    global GATEWAY_URL
    if not isinstance(asyncio.get_running_loop(), uvloop.Loop):
        yield "channels"
        return
    async with serving_gateway() as url:
        GATEWAY_URL = url
        try:
            yield "gateway"
        finally:
            GATEWAY_URL = None


async def connect(token):
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    if GATEWAY_URL is not None:
        communicator = GatewayCommunicator(GATEWAY_URL, headers)
    else:
        communicator = WebsocketCommunicator(application, "/ws/agent/", headers=headers)
    connected, _ = await communicator.connect()
    assert connected
    return communicator


async def send(communicator, frame):
    await communicator.send_to(text_data=json.dumps(frame))


async def receive(communicator):
    return json.loads(await communicator.receive_from(timeout=5))


async def closed_with(communicator):
    message = await communicator.receive_output(timeout=5)
    assert message["type"] == "websocket.close", message
    return message.get("code")


async def join(token, **hello_fields):
    """Connect, say hello, read welcome and config; returns (communicator, welcome)."""
    communicator = await connect(token)
    await send(communicator, hello(**hello_fields))
    welcome = await receive(communicator)
    assert welcome["type"] == "welcome", welcome
    config = await receive(communicator)
    assert config["type"] == "config"
    return communicator, welcome


@pytest.mark.parametrize("token", [None, "cuj_unknown"])
async def test_a_bad_token_is_closed_with_4401(token):
    communicator = await connect(token)
    assert await closed_with(communicator) == 4401


async def test_a_revoked_or_expired_join_token_is_refused(cluster):
    token, plaintext = await database_sync_to_async(do_issue_join_token)(cluster)
    await database_sync_to_async(do_revoke_agent_token)(token)
    assert await closed_with(await connect(plaintext)) == 4401


async def test_a_join_registers_the_node_and_hands_it_a_node_token(join_token):
    communicator, welcome = await join(join_token)
    node = await database_sync_to_async(Node.objects.get)(name="gpu-001")
    assert welcome["node_id"] == node.pk and welcome["sample_interval_s"] == 1.0
    assert welcome["node_token"].startswith("cun_")
    assert await database_sync_to_async(node.gpus.count)() == 8
    await communicator.disconnect()

    communicator, welcome = await join(welcome["node_token"])
    assert "node_token" not in welcome  # absent with a node token, never null
    await communicator.disconnect()
    stored = await database_sync_to_async(list)(AgentToken.objects.values_list("token_hash",
                                                                                flat=True))
    assert all(len(h) == 64 and not h.startswith("cu") for h in stored)  # hashed
    [entry] = await database_sync_to_async(list)(AuditEntry.objects.filter(action="node.join"))
    assert entry.actor_name == "system" and entry.object_repr == "gpu-001"
    assert entry.changes == {"join_token": join_token[:len(entry.changes["join_token"])],
                             "boot_id": "boot-1"}


async def test_a_second_hello_on_the_same_connection_gets_a_welcome_too(join_token):
    communicator, _ = await join(join_token)
    await send(communicator, hello(boot_id="boot-2"))
    assert (await receive(communicator))["type"] == "welcome"
    assert (await receive(communicator))["type"] == "config"
    await communicator.disconnect()


@pytest.mark.parametrize("text, field", [
    ("{not json", "not JSON"),
    ("[]", "a frame must be a JSON object"),
    ('{"seq": 3}', "type: required"),
    ('{"type": "telemetry"}', "type: unknown frame type"),
    (json.dumps({**sample(), "seq": "3"}), "sample.seq: expected an integer"),
    (json.dumps({**sample(), "gpus": [{"uuid": "GPU-0000", "temp_c": "55"}]}),
     "sample.gpus[0].temp_c: expected a number"),
])
async def test_a_bad_frame_gets_an_error_and_the_connection_stays(join_token, text, field):
    communicator, _ = await join(join_token)
    await communicator.send_to(text_data=text)
    error = await receive(communicator)
    assert error["type"] == "error" and error["code"] == "bad_message"
    assert field in error["message"]
    await send(communicator, event())
    assert (await receive(communicator))["type"] == "ack"
    await communicator.disconnect()


async def test_a_binary_frame_is_a_bad_frame(join_token):
    communicator, _ = await join(join_token)
    await communicator.send_to(bytes_data=b"\x00\x01")
    assert (await receive(communicator))["code"] == "bad_message"
    await communicator.disconnect()


async def test_frames_before_hello_are_refused_and_not_acked(join_token):
    communicator = await connect(join_token)
    await send(communicator, event())
    error = await receive(communicator)
    assert error == {"type": "error", "code": "hello_required", "message": "send hello first"}
    assert not await database_sync_to_async(HealthEvent.objects.exists)()
    await send(communicator, hello())
    assert (await receive(communicator))["type"] == "welcome"
    await communicator.disconnect()


async def test_more_than_20_bad_frames_close_the_connection_with_4400(join_token):
    communicator, _ = await join(join_token)
    for _ in range(20):
        await communicator.send_to(text_data="garbage")
        assert (await receive(communicator))["type"] == "error"
    await communicator.send_to(text_data="garbage")
    assert await closed_with(communicator) == 4400


async def test_hello_required_counts_as_a_bad_frame(join_token):
    communicator = await connect(join_token)
    for _ in range(20):
        await send(communicator, sample())
        assert (await receive(communicator))["code"] == "hello_required"
    await send(communicator, sample())
    assert await closed_with(communicator) == 4400


async def test_a_frame_over_1_mib_closes_with_1009(join_token):
    communicator, _ = await join(join_token)
    await send(communicator, {**sample(), "padding": "x" * (1024 * 1024)})
    assert await closed_with(communicator) == 1009


async def test_a_node_token_naming_another_node_is_closed_with_4403(join_token):
    communicator, welcome = await join(join_token)
    await communicator.disconnect()
    communicator = await connect(welcome["node_token"])
    await send(communicator, hello(node="gpu-002"))
    assert await closed_with(communicator) == 4403


async def test_a_second_connection_replaces_the_first_with_4409(join_token):
    first, welcome = await join(join_token)
    second, _ = await join(welcome["node_token"])
    assert await closed_with(first) == 4409
    await send(second, event())
    assert (await receive(second))["type"] == "ack"
    await second.disconnect()


async def open_to_rejoin(name="gpu-001", hours=1):
    node = await database_sync_to_async(Node.objects.get)(name=name)
    await database_sync_to_async(do_open_rejoin)(
        node, by="ada", until=timezone.now() + timedelta(hours=hours))


async def test_a_rejoin_issues_a_new_token_revokes_the_old_and_is_on_the_timeline(join_token):
    first, welcome = await join(join_token)
    await open_to_rejoin()
    second, rejoined = await join(join_token)
    assert await closed_with(first) == 4409
    assert rejoined["node_token"] != welcome["node_token"]
    await second.disconnect()
    assert await closed_with(await connect(welcome["node_token"])) == 4401
    reasons = await database_sync_to_async(list)(
        NodeTransition.objects.values_list("reason", flat=True))
    assert any(reason.startswith(f"re-joined with join token {join_token[:12]}… (opened by "
                                 f"ada until") for reason in reasons)


async def test_an_event_is_stored_once_and_acked_every_time(join_token):
    communicator, _ = await join(join_token)
    frame = event(count=3)
    for _ in range(2):
        await send(communicator, frame)
        assert await receive(communicator) == {"type": "ack", "ids": [frame["id"]]}
    await communicator.disconnect()

    (stored,) = await database_sync_to_async(list)(HealthEvent.objects.select_related("gpu"))
    assert (stored.signature, stored.count, stored.gpu.uuid) == ("xid:79", 3, "GPU-0003")
    assert stored.evidence["xid"] == 79
    node = await database_sync_to_async(Node.objects.get)(name="gpu-001")
    assert node.state == "booting"  # booting wins over unhealthy during the boot window
    assert node.state_reason == "rebooted (new boot id)"


async def test_a_cleared_event_closes_the_open_one(join_token, settings):
    settings.CLUSTERUI_BOOT_WINDOW_S = 0
    communicator, _ = await join(join_token)
    await send(communicator, event("thermal_throttle", severity="warning"))
    await receive(communicator)
    node = await database_sync_to_async(Node.objects.get)(name="gpu-001")
    assert node.state == "unhealthy"
    await send(communicator, event("thermal_throttle", severity="warning", state="cleared"))
    await receive(communicator)
    await communicator.disconnect()
    node = await database_sync_to_async(Node.objects.get)(name="gpu-001")
    assert node.state == "healthy"
    assert not await database_sync_to_async(HealthEvent.objects.open().exists)()


async def test_a_malformed_event_is_refused_with_its_id(join_token):
    communicator, _ = await join(join_token)
    frame = {**event(), "severity": "apocalyptic"}
    await send(communicator, frame)
    error = await receive(communicator)
    assert error["id"] == frame["id"] and "event.severity" in error["message"]
    await communicator.disconnect()


async def test_a_sample_gpu_not_in_the_hello_is_dropped_with_an_error(join_token):
    communicator, _ = await join(join_token)
    await send(communicator, sample(uuids=("GPU-0000", "GPU-ffff")))
    error = await receive(communicator)
    assert error["code"] == "bad_message" and "GPU-ffff" in error["message"]
    for _ in range(25):  # does not count as a bad frame
        await send(communicator, sample(uuids=("GPU-ffff",)))
        await receive(communicator)
    await send(communicator, event())
    assert (await receive(communicator))["type"] == "ack"
    await communicator.disconnect()


async def test_a_bad_node_never_affects_another(join_token):
    good, _ = await join(join_token, node="gpu-001")
    bad, _ = await join(join_token, node="gpu-002")
    for _ in range(21):
        await bad.send_to(text_data="\xff garbage")
    for _ in range(20):
        await receive(bad)
    assert await closed_with(bad) == 4400
    await send(good, event())
    assert (await receive(good))["type"] == "ack"
    await good.disconnect()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8,
)
random_frames = st.one_of(
    st.text(min_size=1, max_size=40),
    st.dictionaries(st.sampled_from(["type", "seq", "ts", "gpus", "id", "node", "boot_id"]),
                    json_values, max_size=5).map(json.dumps),
    st.builds(lambda t, extra: json.dumps({"type": t, **extra}),
              st.sampled_from(["hello", "sample", "event", "check_result", "command_result",
                               "script_result", "welcome"]),
              st.dictionaries(st.text(max_size=8), json_values, max_size=4)),
)


@hypothesis_settings(max_examples=25, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frames=st.lists(random_frames, min_size=1, max_size=15))
async def test_random_frames_never_break_the_connection(join_token, frames):
    communicator, _ = await join(join_token, node=f"gpu-{uuid.uuid4().hex[:12]}")
    for text in frames:
        await communicator.send_to(text_data=text)
        reply = await receive(communicator)
        assert reply["type"] in {"error", "ack", "welcome", "config"}
        if reply["type"] == "welcome":
            await receive(communicator)
    await send(communicator, event())
    assert (await receive(communicator))["type"] == "ack"
    await communicator.disconnect()


async def test_an_xids_severity_comes_from_nvidias_catalog(join_token, settings):
    settings.CLUSTERUI_BOOT_WINDOW_S = 0
    communicator, _ = await join(join_token)
    await send(communicator, event("xid:13", severity="critical"))  # RESTART_APP
    await receive(communicator)
    await communicator.disconnect()
    stored = await database_sync_to_async(HealthEvent.objects.get)()
    assert stored.severity == "info" and stored.evidence["agent_severity"] == "critical"
    node = await database_sync_to_async(Node.objects.get)(name="gpu-001")
    assert node.state == "healthy"  # the application's problem, not the node's


async def test_hellos_do_not_wait_for_each_other_or_for_the_event_writer(join_token,
                                                                        monkeypatch):
    """After a server restart every agent says hello at once: hellos run on threads of their
    own, side by side, and not behind a batch of events being written."""
    first, _ = await join(join_token, node="gpu-001")
    writing, written = threading.Event(), threading.Event()
    original_ingest = ingest.ingest_events

    def slow_batch(items, now=None):
        writing.set()
        written.wait(10)  # held until the hellos below are done
        return original_ingest(items, now=now)

    both = threading.Barrier(2)
    original_hello = ingest.accept_hello

    def hello_together(grant, frame, now=None):
        both.wait(5)  # broken (an error, no welcome) if the other cannot run meanwhile
        return original_hello(grant, frame, now=now)

    monkeypatch.setattr(ingest, "ingest_events", slow_batch)
    monkeypatch.setattr(ingest, "accept_hello", hello_together)
    await send(first, event())
    await asyncio.to_thread(writing.wait, 5)

    joined = await asyncio.gather(join(join_token, node="gpu-002"),
                                  join(join_token, node="gpu-003"))

    assert [welcome["type"] for _, welcome in joined] == ["welcome", "welcome"]
    written.set()
    assert (await receive(first))["type"] == "ack"
    for communicator in [first, *(c for c, _ in joined)]:
        await communicator.disconnect()
