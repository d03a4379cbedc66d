"""One open event per (node, GPU, signature): repeats count, they never open new rows."""

import threading
import uuid

import pytest
from django.db import connection

from healthchecks.models import HealthEvent
from healthchecks.services import do_close_health_event, do_record_health_event
from gateway.ingest import EventOutcome, ingest_events
from nodes.tests.factories import GpuFactory, NodeFactory

STORM = 10_000


def xid_frame(gpu_uuid, count=None):
    frame = {"type": "event", "id": str(uuid.uuid4()), "ts": 1764442001.5, "signature": "xid:79",
             "gpu_uuid": gpu_uuid, "severity": "critical",
             "message": "GPU has fallen off the bus", "detail": {"xid": 79, "source": "kmsg"}}
    if count is not None:
        frame["count"] = count
    return frame


@pytest.mark.django_db
def test_a_storm_coalesced_by_the_agent_is_one_event():
    gpu = GpuFactory(uuid="GPU-dd6e")
    assert ingest_events([(gpu.node_id, xid_frame("GPU-dd6e", count=STORM))]) == [
        EventOutcome.STORED]
    (event,) = HealthEvent.objects.all()
    assert event.count == STORM


@pytest.mark.django_db
def test_a_storm_sent_line_by_line_is_one_event():
    gpu = GpuFactory(uuid="GPU-dd6e")
    for _ in range(500):  # one at a time, as at a trickle
        ingest_events([(gpu.node_id, xid_frame("GPU-dd6e"))])
    for _ in range(STORM // 500 - 1):  # in batches, as the server writes a storm
        ingest_events([(gpu.node_id, xid_frame("GPU-dd6e")) for _ in range(500)])
    (event,) = HealthEvent.objects.all()
    assert event.count == STORM


@pytest.mark.django_db
def test_the_same_signature_on_another_gpu_or_the_node_is_another_event():
    node = NodeFactory()
    gpu0, gpu1 = GpuFactory(node=node, index=0), GpuFactory(node=node, index=1)
    for gpu in (gpu0, gpu1, None, None):
        do_record_health_event(node, signature="xid:79", severity="critical", gpu=gpu)
    assert sorted(HealthEvent.objects.values_list("count", flat=True)) == [1, 1, 2]


@pytest.mark.django_db
def test_a_closed_event_does_not_absorb_a_new_signal():
    node = NodeFactory()
    first = do_record_health_event(node, signature="thermal_throttle", severity="warning")
    do_close_health_event(first, reason="cleared")
    second = do_record_health_event(node, signature="thermal_throttle", severity="warning")
    assert second.pk != first.pk and second.count == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_signals_open_one_event(settings):
    if connection.vendor != "postgresql":
        pytest.skip("SQLite serializes writers; the race needs PostgreSQL (make test)")
    node = NodeFactory()
    start = threading.Barrier(4)
    errors = []

    def record():
        from django.db import connections

        try:
            start.wait()
            do_record_health_event(node, signature="xid:48", severity="critical")
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=record) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    (event,) = HealthEvent.objects.filter(signature="xid:48")
    assert event.count == 4
