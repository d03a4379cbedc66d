"""Notices (healthchecks.signatures): a happening, not a condition. Each is an event of its
own, closed as it is recorded, beside the conditions of the same batch; the node's state
does not move."""

import uuid

import pytest

from healthchecks.models import HealthEvent
from healthchecks.services import NOTICE_CLOSED_REASON
from healthchecks.signatures import NOTICES, SIGNATURES, info_for, is_notice
from gateway.ingest import EventOutcome, ingest_events
from nodes.tests.factories import NodeFactory

pytestmark = pytest.mark.django_db


def frame(signature, severity="info", state="active", message="", detail=None):
    return {"type": "event", "id": str(uuid.uuid4()), "ts": 1764442001.5,
            "signature": signature, "severity": severity, "state": state,
            "message": message or signature, "detail": detail or {}}


def test_each_notice_is_its_own_closed_event_and_conditions_beside_them_open():
    node = NodeFactory(state="healthy")
    outcomes = ingest_events([
        (node.pk, frame("slurmd_restarted", message="restart 1", detail={"pid": 1})),
        (node.pk, frame("zombie_processes", "warning", message="12 zombies")),
        (node.pk, frame("slurmd_restarted", message="restart 2", detail={"pid": 2})),
        (node.pk, frame("job_cleanup", detail={"job_id": "7"})),
        (node.pk, frame("slurmd_restarted", state="cleared")),  # nothing to clear
    ])
    assert outcomes == [EventOutcome.STORED] * 5
    restarts = HealthEvent.objects.filter(signature="slurmd_restarted").order_by("id")
    assert [(e.message, e.evidence["pid"], e.closed_reason) for e in restarts] == [
        ("restart 1", 1, NOTICE_CLOSED_REASON), ("restart 2", 2, NOTICE_CLOSED_REASON)]
    assert all(e.closed_at == e.first_seen for e in restarts)
    assert HealthEvent.objects.get(signature="job_cleanup").evidence["job_id"] == "7"
    (still_open,) = HealthEvent.objects.open()
    assert still_open.signature == "zombie_processes"
    node.refresh_from_db()
    assert node.state == "unhealthy"  # the zombies, not the notices


def test_a_notice_alone_leaves_the_node_as_it_was():
    node = NodeFactory(state="healthy")
    ingest_events([(node.pk, frame("job_cleanup"))])
    node.refresh_from_db()
    assert node.state == "healthy"


def test_the_catalog_names_every_hygiene_signature():
    for name in ("slurmd_restarted", "slurmd_down", "slurmd_flapping", "zombie_processes",
                 "pid_pressure", "job_cleanup", "job_leftovers", "gres_drift"):
        assert name in SIGNATURES
    assert NOTICES == {"slurmd_restarted", "job_cleanup"}
    assert is_notice("job_cleanup") and not is_notice("job_leftovers")
    assert info_for("xid:79") is SIGNATURES["xid:<code>"]
    assert info_for("check:gpu_compute") is SIGNATURES["check:<name>"]
    assert info_for("no_such_thing") is None
