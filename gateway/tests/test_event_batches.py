"""Agent events stored a batch at a time (gateway.ingest.ingest_events, gateway.event_batches):
the same outcome as one at a time, each node refreshed once per batch, every event stored
once however many connections deliver it, and a failure answered with server_error."""

import threading
import uuid
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.db import connection
from django.utils import timezone

from healthchecks.services import events as health_events
from healthchecks.services import facts as health_facts
from healthchecks.models import HealthEvent
from gateway import ingest
from gateway.ingest import EventOutcome, ingest_events
from nodes.models import AgentEventReceipt
from nodes.services import do_issue_join_token, prune_event_receipts
from nodes.tasks import prune_event_receipts as prune_task
from nodes.tests.factories import GpuFactory, NodeFactory
from gateway.tests.test_consumers import join, receive, send


def event_frame(signature="thermal_throttle", gpu_uuid=None, state=None, **extra):
    frame = {"type": "event", "id": str(uuid.uuid4()), "ts": 1764442001.5,
             "signature": signature, "severity": "warning", "message": "throttled",
             "detail": {"source": "nvml"}, **extra}
    if gpu_uuid:
        frame["gpu_uuid"] = gpu_uuid
    if state:
        frame["state"] = state
    return frame


@pytest.fixture
def refreshes(monkeypatch):
    """The node ids of each refresh of health facts, a sorted list per refresh."""
    seen = []
    original = health_facts.refresh_health_facts_of

    def spy(reasons, **kwargs):
        seen.append(sorted(reasons))
        return original(reasons, **kwargs)

    for module in (health_facts, health_events):  # the modules that call it
        monkeypatch.setattr(module, "refresh_health_facts_of", spy)
    return seen


@pytest.mark.django_db
def test_a_batch_opens_counts_and_clears_as_one_at_a_time_would(refreshes):
    node_a, node_b = NodeFactory(name="gpu-001"), NodeFactory(name="gpu-002")
    gpu = GpuFactory(node=node_a, index=3, uuid="GPU-0003")
    repeats = [event_frame(gpu_uuid="GPU-0003", message=f"throttled {n}") for n in range(5)]
    batch = [(node_a.pk, frame) for frame in repeats]
    batch += [(node_b.pk, event_frame("pcie_replay")),
              (node_b.pk, event_frame("pcie_replay", state="cleared")),
              (node_b.pk, event_frame("pcie_replay", count=7)),
              (node_a.pk, event_frame("xid:79", gpu_uuid="GPU-0003", severity="info"))]

    outcomes = ingest_events(batch)

    assert outcomes == [EventOutcome.STORED] * len(batch)
    throttle = HealthEvent.objects.get(node=node_a, signature="thermal_throttle")
    assert (throttle.gpu, throttle.count, throttle.message) == (gpu, 5, "throttled 4")
    # NVIDIA's catalog, not the agent, says how bad an Xid 79 is.
    assert HealthEvent.objects.get(node=node_a, signature="xid:79").severity == "critical"
    closed, reopened = HealthEvent.objects.filter(node=node_b).order_by("id")
    assert (closed.count, closed.closed_reason) == (1, "cleared by the agent")
    assert (reopened.count, reopened.closed_at) == (7, None)
    # Every receipt points at the event it touched.
    links = dict(AgentEventReceipt.objects.values_list("event_id", "health_event_id"))
    assert {links[uuid.UUID(frame["id"])] for frame in repeats} == {throttle.pk}
    assert [links[uuid.UUID(frame["id"])] for _, frame in batch[5:8]] == [
        closed.pk, closed.pk, reopened.pk]
    # The nodes' states were worked out once for the whole batch, not once per event.
    assert refreshes == [sorted([node_a.pk, node_b.pk])]
    node_a.refresh_from_db()
    assert node_a.open_problem == "xid:79 on GPU 3 (+1 more)"


@pytest.mark.django_db
def test_repeats_on_many_events_each_get_their_own_count_and_message():
    nodes = [NodeFactory(name=f"gpu-{n:03d}") for n in range(4)]
    ingest_events([(node.pk, event_frame(message="first")) for node in nodes])

    ingest_events([(nodes[0].pk, event_frame(message="again")),
                   (nodes[1].pk, event_frame(count=5, message="again")),
                   (nodes[2].pk, event_frame(count=5, message="")),
                   (nodes[3].pk, event_frame(message="other"))])

    events = {event.node_id: (event.count, event.message) for event in HealthEvent.objects.all()}
    assert [events[node.pk] for node in nodes] == [
        (2, "again"), (6, "again"), (6, "first"), (2, "other")]


@pytest.mark.django_db
def test_repeats_of_an_open_event_count_on_it_without_refreshing_the_node(refreshes):
    node = NodeFactory()
    ingest_events([(node.pk, event_frame())])
    refreshes.clear()

    ingest_events([(node.pk, event_frame(count=2)), (node.pk, event_frame(count=3))])

    assert HealthEvent.objects.get(node=node).count == 6
    assert refreshes == []


@pytest.mark.django_db
def test_an_event_is_stored_once_whether_resent_in_the_batch_or_later():
    node = NodeFactory()
    frame = event_frame()
    assert ingest_events([(node.pk, frame), (node.pk, frame)]) == [
        EventOutcome.STORED, EventOutcome.DUPLICATE]
    assert ingest_events([(node.pk, frame), (node.pk, event_frame())]) == [
        EventOutcome.DUPLICATE, EventOutcome.STORED]
    assert HealthEvent.objects.get(node=node).count == 2
    assert AgentEventReceipt.objects.count() == 2


@pytest.mark.django_db
def test_one_nodes_failing_event_fails_only_that_nodes_events(monkeypatch):
    healthy, broken = NodeFactory(name="gpu-001"), NodeFactory(name="gpu-002")
    original = ingest.severity_of

    def severity_of(frame, gpu):
        if frame["signature"] == "poison":
            raise ValueError("a bug")
        return original(frame, gpu)

    monkeypatch.setattr(ingest, "severity_of", severity_of)
    batch = [(healthy.pk, event_frame()), (broken.pk, event_frame()),
             (broken.pk, event_frame("poison")), (healthy.pk, event_frame("pcie_replay"))]

    outcomes = ingest_events(batch)

    assert outcomes == [EventOutcome.STORED, EventOutcome.FAILED, EventOutcome.FAILED,
                        EventOutcome.STORED]
    assert set(HealthEvent.objects.values_list("node__name", "signature")) == {
        ("gpu-001", "thermal_throttle"), ("gpu-001", "pcie_replay")}
    # Nothing of the failed node's is kept: its agent sends both again and they are new.
    assert not AgentEventReceipt.objects.filter(node=broken).exists()
    monkeypatch.setattr(ingest, "severity_of", original)
    assert ingest_events([batch[1], batch[2]]) == [EventOutcome.STORED] * 2


@pytest.mark.django_db(transaction=True)
def test_the_same_events_delivered_by_two_writers_at_once_are_stored_once():
    if connection.vendor != "postgresql":
        pytest.skip("SQLite writes one transaction at a time: run it with `make test`")
    node = NodeFactory()
    batch = [(node.pk, event_frame()) for _ in range(50)]
    together, outcomes, writes = threading.Barrier(2), [], []
    original_record = ingest.do_record_signals

    def record_together(signals, **kwargs):
        writes.append(len(signals))
        if len(writes) <= 2:
            together.wait(5)  # both found none of the events received
        return original_record(signals, **kwargs)

    def write():
        try:
            outcomes.append(ingest_events(batch))
        finally:
            connection.close()

    ingest.do_record_signals = record_together
    try:
        writers = [threading.Thread(target=write) for _ in range(2)]
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join(30)
    finally:
        ingest.do_record_signals = original_record

    assert len(outcomes) == 2
    for index in range(len(batch)):
        assert sorted(o[index].value for o in outcomes) == ["duplicate", "stored"]
    assert HealthEvent.objects.get(node=node).count == 50
    # The second waited for the first's commit, found its receipts, rolled back and went
    # again: with nothing left to store.
    assert writes == [50, 50, 0]


# The writer behind the agent consumer.


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_events_of_many_connections_share_batches(cluster, in_memory_channel_layer,
                                                        monkeypatch):
    token = (await database_sync_to_async(do_issue_join_token)(cluster))[1]
    agents = [(await join(token, node=f"gpu-{n:03d}"))[0] for n in range(20)]
    sizes, original = [], ingest.ingest_events

    def slow_first_batch(items, now=None):
        sizes.append(len(items))
        if len(sizes) == 1:
            threading.Event().wait(0.3)  # the others arrive while the first is written
        return original(items, now=now)

    monkeypatch.setattr(ingest, "ingest_events", slow_first_batch)
    frames = [event_frame() for _ in agents]
    for agent, frame in zip(agents, frames):
        await send(agent, frame)
    acks = [await receive(agent) for agent in agents]

    assert acks == [{"type": "ack", "ids": [frame["id"]]} for frame in frames]
    assert sum(sizes) == 20 and len(sizes) < 20, sizes
    assert await database_sync_to_async(HealthEvent.objects.count)() == 20
    for agent in agents:
        await agent.disconnect()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_an_event_not_stored_gets_server_error_with_retry_id_and_the_connection_stays(
        cluster, in_memory_channel_layer, monkeypatch):
    token = (await database_sync_to_async(do_issue_join_token)(cluster))[1]
    agent, _ = await join(token)
    original = ingest.ingest_events

    def database_down(items, now=None):
        raise ConnectionError("the database is down")

    monkeypatch.setattr(ingest, "ingest_events", database_down)
    lost = event_frame()
    await send(agent, lost)
    error = await receive(agent)
    # retry_id, not id: the agent keeps the event and sends it again (PROTOCOL.md).
    assert (error["type"], error["code"], error["retry_id"]) == ("error", "server_error",
                                                                 lost["id"])
    assert "id" not in error

    monkeypatch.setattr(ingest, "ingest_events", original)
    await send(agent, lost)
    assert await receive(agent) == {"type": "ack", "ids": [lost["id"]]}
    assert await database_sync_to_async(HealthEvent.objects.count)() == 1
    await agent.disconnect()


@pytest.mark.django_db
def test_event_receipts_are_forgotten_after_their_retention(settings):
    settings.CLUSTERUI_EVENT_RECEIPT_RETENTION_DAYS = 30
    node, now = NodeFactory(), timezone.now()
    old, recent = event_frame(), event_frame()
    ingest_events([(node.pk, old)], now=now - timedelta(days=31))
    ingest_events([(node.pk, recent)], now=now - timedelta(days=29))

    assert prune_event_receipts(now=now) == 1
    assert prune_task() == 0
    # The old one, sent again, is stored again; the recent one is still a duplicate.
    assert ingest_events([(node.pk, old), (node.pk, recent)]) == [
        EventOutcome.STORED, EventOutcome.DUPLICATE]
