"""Count windows (DESIGN.md "Repairs"): the same fault N times in a window raises the
action. An occurrence is an event frame with a new id (a coalesced burst is one); a benign
Xid never counts; record-only mode changes nothing and says what it would have done."""

import uuid
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from gateway.ingest import EventOutcome, ingest_events
from nodes.tests.factories import GpuFactory, NodeFactory
from repairs.choices import Status
from repairs.models import RepairSettings
from repairs.services import refresh_recommendation
from repairs.tests.factories import RepairFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def node(cluster):
    node = NodeFactory(cluster=cluster, name="gpu-040")
    for index in range(8):
        GpuFactory(node=node, index=index, uuid=f"GPU-40-{index}", name="NVIDIA H200")
    return node


def xid(node, code, *, gpu=3, count=None, at=None):
    """One event frame from the agent, as the gateway stores it."""
    frame = {"type": "event", "id": str(uuid.uuid4()), "ts": 1764442001.5,
             "signature": f"xid:{code}", "severity": "critical", "state": "active",
             "message": f"Xid {code}", "gpu_uuid": f"GPU-40-{gpu}", "detail": {}}
    if count is not None:
        frame["count"] = count
    (outcome,) = ingest_events([(node.pk, frame)], now=at)
    assert outcome == EventOutcome.STORED, outcome


def five_reboots_in_7_days(node, now):
    for days_ago in (6, 5, 3, 2, 1):
        RepairFactory(node=node, action="reboot", signature="slurm_drain",
                      status=Status.SUCCEEDED, started_at=now - timedelta(days=days_ago),
                      finished_at=now - timedelta(days=days_ago))


def test_five_fatal_xids_on_one_gpu_in_24_hours_mean_remove(node):
    now = timezone.now()
    for hours_ago in (20, 12, 6, 2, 0):
        xid(node, 48, at=now - timedelta(hours=hours_ago))
    repair = refresh_recommendation(node, now=now)
    assert repair.action == "remove"
    assert repair.reason.startswith("5 fatal Xids on GPU 3 in 24 h (the window trips at 5): "
                                    "remove")


def test_four_or_older_ones_do_not_trip_it(node):
    now = timezone.now()
    xid(node, 48, at=now - timedelta(hours=30))  # outside the window
    for hours_ago in (12, 6, 2, 0):
        xid(node, 48, at=now - timedelta(hours=hours_ago))
    assert refresh_recommendation(node, now=now).action == "reset_gpu"


def test_a_coalesced_burst_is_one_occurrence(node):
    xid(node, 79, count=200)
    assert refresh_recommendation(node).action == "reboot"


def test_a_storm_of_a_benign_xid_across_every_gpu_never_escalates(node):
    for _ in range(10):
        for gpu in range(8):
            xid(node, 13, gpu=gpu)  # RESTART_APP: the application's fault
    assert refresh_recommendation(node) is None


def test_five_repairs_of_a_node_in_7_days_mean_remove(node):
    now = timezone.now()
    five_reboots_in_7_days(node, now)
    xid(node, 79, at=now)
    repair = refresh_recommendation(node, now=now)
    assert repair.action == "remove"
    assert repair.reason.startswith("5 repairs of gpu-040 in 7 days")


def test_record_only_changes_nothing_and_says_what_it_would_have_done(cluster, node,
                                                                      client_for, viewer):
    RepairSettings.objects.create(cluster=cluster, window_mode="record_only")
    now = timezone.now()
    for hours_ago in (20, 12, 6, 2, 0):
        xid(node, 48, at=now - timedelta(hours=hours_ago))
    repair = refresh_recommendation(node, now=now)
    assert repair.action == "reset_gpu"
    assert repair.would_have == ("would have recommended remove: 5 fatal Xids on GPU 3 in "
                                 "24 h (the window trips at 5)")
    page = client_for(viewer).get(repair.get_absolute_url()).text
    assert "Record-only count window: would have recommended remove" in page
    repair.status, repair.finished_at, repair.outcome = "rejected", now, "rejected"
    repair.save()
    history = client_for(viewer).get(reverse("repairs:list", args=[cluster.slug])).text
    assert "record-only: would have recommended remove: 5 fatal Xids on GPU 3" in history


def test_windows_leave_a_clean_up_alone(node):
    now = timezone.now()
    five_reboots_in_7_days(node, now)
    frame = {"type": "event", "id": str(uuid.uuid4()), "ts": 1764442001.5,
             "signature": "zombie_processes", "severity": "warning", "state": "active",
             "message": "14 zombies", "detail": {}}
    ingest_events([(node.pk, frame)], now=now)
    assert refresh_recommendation(node, now=now).action == "cleanup"
