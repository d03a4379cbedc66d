"""Floods are bounded (issue 15, point 2; PROTOCOL.md, Limits): a token bucket per connection
for every frame but samples, caps per node on open and new events, a bound on a
connection's events being stored; past them `rate_limited` with a retry_after_s (an event
with its retry_id), never counted as a bad frame, and 4429 for a connection that goes on
past it."""

import asyncio
import functools
import threading

import pytest
from channels.db import database_sync_to_async

from healthchecks.models import HealthEvent
from gateway import consumers, ingest
from gateway.frame_limits import FrameBucket, NewEventCounts
from gateway.tests.test_consumers import event, join, receive, sample, send

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("in_memory_channel_layer")]


@pytest.fixture(autouse=True)
def fresh_counts(monkeypatch):
    # A fixed clock: on real time the hour could turn mid-test and start the count again.
    monkeypatch.setattr(consumers, "NEW_EVENTS", NewEventCounts(clock=lambda: 36000.0))


@pytest.fixture
def bucket_clock(monkeypatch):
    """The connections' FrameBucket on a clock the test moves: on real time a slow machine
    would refill the bucket while the test sends."""
    now = [0.0]
    monkeypatch.setattr(consumers, "FrameBucket",
                        functools.partial(FrameBucket, clock=lambda: now[0]))
    return now


async def answers(agent, count):
    return [await receive(agent) for _ in range(count)]


def by_kind(frames):
    acked = [i for f in frames if f["type"] == "ack" for i in f["ids"]]
    limited = [f for f in frames if f.get("code") == "rate_limited"]
    return acked, limited


async def test_past_the_bucket_events_are_answered_rate_limited_in_turn(join_token, settings,
                                                                       bucket_clock):
    settings.CLUSTERUI_AGENT_FRAMES_PER_S = 5.0
    settings.CLUSTERUI_AGENT_FRAME_BURST = 10
    agent, _ = await join(join_token)  # the hello took a token
    frames = [event(signature=f"sig_{i}") for i in range(30)]
    for frame in frames:
        await send(agent, frame)
    acked, limited = by_kind(await answers(agent, 30))
    assert len(acked) in (9, 10) and len(acked) + len(limited) == 30
    assert {f["retry_id"] for f in limited} == {f["id"] for f in frames} - set(acked)
    waits = [f["retry_after_s"] for f in limited]
    assert waits == sorted(waits) and waits[-1] > waits[0]  # each its own turn, spread out
    assert waits[-1] <= (10 + 1) / 5.0 + 0.05  # the debt is bounded by one burst
    # 20 refusals are no bad frames: the connection is open, and a retry in turn is taken.
    bucket_clock[0] += limited[0]["retry_after_s"]
    retry = next(f for f in frames if f["id"] == limited[0]["retry_id"])
    await send(agent, retry)
    assert await receive(agent) == {"type": "ack", "ids": [retry["id"]]}
    await agent.disconnect()


async def test_a_connection_that_goes_on_past_rate_limited_is_closed_4429(join_token, settings):
    settings.CLUSTERUI_AGENT_FRAMES_PER_S = 1.0
    settings.CLUSTERUI_AGENT_FRAME_BURST = 1
    settings.CLUSTERUI_AGENT_RATE_LIMIT_CLOSE_S = 0.5
    agent, _ = await join(join_token)
    while True:
        await send(agent, event())
        message = await agent.receive_output(timeout=5)
        if message["type"] == "websocket.close":
            assert message["code"] == 4429
            break
        await asyncio.sleep(0.05)


async def test_an_agent_that_waits_its_turn_is_not_closed(join_token, settings, monkeypatch):
    """Bursts refused in part, each waited out: every stretch of refusals is short, and ends
    (RATE_LIMITED_GAP_S without one), so none goes on for the close time."""
    settings.CLUSTERUI_AGENT_FRAMES_PER_S = 10.0
    settings.CLUSTERUI_AGENT_FRAME_BURST = 2
    settings.CLUSTERUI_AGENT_RATE_LIMIT_CLOSE_S = 0.5
    monkeypatch.setattr(consumers, "RATE_LIMITED_GAP_S", 0.2)
    agent, _ = await join(join_token)
    refused = 0
    for _ in range(4):  # 1.2 s or more: past the close time, were it going on
        waiting = {}
        for frame in [event(signature=f"sig_{i}") for i in range(4)]:
            await send(agent, frame)
            waiting[frame["id"]] = frame
        while waiting:
            answer = await receive(agent)
            if answer["type"] == "ack":
                waiting.pop(answer["ids"][0])
                continue
            refused += 1
            await asyncio.sleep(answer["retry_after_s"])  # as agent.client does
            await send(agent, waiting[answer["retry_id"]])
        await asyncio.sleep(0.3)
    assert refused >= 4
    await agent.disconnect()


async def test_samples_are_not_limited(join_token, settings):
    settings.CLUSTERUI_AGENT_FRAMES_PER_S = 1.0
    settings.CLUSTERUI_AGENT_FRAME_BURST = 2
    agent, _ = await join(join_token)
    for seq in range(300):
        await send(agent, sample(seq=seq))
    normal = event()
    await send(agent, normal)
    assert await receive(agent) == {"type": "ack", "ids": [normal["id"]]}  # nothing before it
    await agent.disconnect()


async def test_a_node_stores_at_most_so_many_new_events_an_hour(join_token, settings):
    settings.CLUSTERUI_AGENT_NEW_EVENTS_PER_HOUR = 3
    agent, _ = await join(join_token)
    frames = [event(signature=f"sig_{i}") for i in range(4)]
    for frame in frames[:3]:
        await send(agent, frame)
        assert (await receive(agent))["type"] == "ack"
    await send(agent, frames[0])  # a resend of a stored one is acked, and not new
    assert await receive(agent) == {"type": "ack", "ids": [frames[0]["id"]]}
    await send(agent, frames[3])
    answer = await receive(agent)
    assert answer["code"] == "rate_limited" and answer["retry_id"] == frames[3]["id"]
    assert 0 < answer["retry_after_s"] <= 3600 and "new events this hour" in answer["message"]
    assert await database_sync_to_async(HealthEvent.objects.count)() == 3
    await agent.disconnect()


async def test_a_node_at_its_open_events_cap_opens_no_new_one_but_repeats_and_clears(
        join_token, settings):
    settings.CLUSTERUI_AGENT_OPEN_EVENTS_MAX = 2
    settings.CLUSTERUI_BOOT_WINDOW_S = 0
    agent, _ = await join(join_token)
    for signature in ("sig_a", "sig_b"):
        await send(agent, event(signature=signature))
        assert (await receive(agent))["type"] == "ack"
    third = event(signature="sig_c")
    await send(agent, third)
    answer = await receive(agent)
    assert answer["code"] == "rate_limited" and answer["retry_id"] == third["id"]
    assert "2 open events" in answer["message"]
    for frame in (event(signature="sig_a"), event(signature="sig_b", state="cleared")):
        await send(agent, frame)
        assert await receive(agent) == {"type": "ack", "ids": [frame["id"]]}
    await send(agent, third)  # one closed: there is room again
    assert await receive(agent) == {"type": "ack", "ids": [third["id"]]}
    open_signatures = await database_sync_to_async(list)(
        HealthEvent.objects.open().order_by("signature").values_list("signature", flat=True))
    assert open_signatures == ["sig_a", "sig_c"]
    await agent.disconnect()


async def test_a_connection_reads_on_while_its_events_are_stored_up_to_a_bound(
        join_token, monkeypatch):
    """The memory a connection holds is bounded: past EVENTS_IN_FLIGHT events being stored,
    the next is answered at once, without waiting for the database."""
    monkeypatch.setattr(consumers, "EVENTS_IN_FLIGHT", 3)
    agent, _ = await join(join_token)
    release = threading.Event()
    original = ingest.ingest_events

    def slow_ingest(items, now=None):
        release.wait(10)
        return original(items, now)

    monkeypatch.setattr(ingest, "ingest_events", slow_ingest)
    frames = [event(signature=f"sig_{i}") for i in range(5)]
    for frame in frames:
        await send(agent, frame)
    first = await answers(agent, 2)  # answered while the first three are being stored
    assert [f.get("retry_id") for f in first] == [frames[3]["id"], frames[4]["id"]]
    release.set()
    acked, _ = by_kind(await answers(agent, 3))
    assert sorted(acked) == sorted(f["id"] for f in frames[:3])
    await agent.disconnect()


async def test_a_refused_event_is_not_a_bad_frame(join_token, settings, bucket_clock):
    settings.CLUSTERUI_AGENT_FRAMES_PER_S = 0.5
    settings.CLUSTERUI_AGENT_FRAME_BURST = 1
    agent, _ = await join(join_token)
    for _ in range(25):  # past the 20 bad frames that close with 4400
        await send(agent, event())
        assert (await receive(agent))["code"] == "rate_limited"
    await agent.disconnect()
