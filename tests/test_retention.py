"""The hourly prunes (issue 28, "Retention settings"), on a week of seeded rows each: the
change feed never past a reader's cursor, startup script runs, closed health events (never
a repair's evidence), and the audit trail only when an admin sets its retention."""

from datetime import timedelta

import pytest
from django.utils import timezone

from clusters import change_feed
from clusters import tasks as cluster_tasks
from clusters.change_feed import Kind, read_changes, record_change
from clusters.models import AuditEntry, Change
from clusters.services import prune_audit
from healthchecks import tasks as health_tasks
from healthchecks.models import HealthEvent
from nodes.tests.factories import NodeFactory
from repairs.tests.factories import RepairFactory
from startup import tasks as startup_tasks
from startup.models import ScriptEvent, ScriptRun

pytestmark = pytest.mark.django_db

NOW = timezone.now()
WEEK = range(7)  # days ago: 0 (today) to 6


def days_ago(days):
    return NOW - timedelta(days=days, minutes=1)


def test_the_change_feed_keeps_what_a_reader_has_not_read_yet(cluster, settings):
    settings.CLUSTERUI_CHANGE_RETENTION_DAYS = 3
    for day in reversed(WEEK):  # the oldest first, as they were recorded
        record_change(Kind.REPAIR, cluster_id=cluster.pk, object_id=str(day), now=days_ago(day))
    # A reader that stopped after the oldest two rows (days 6 and 5) and has been away since.
    assert [c.object_id for c in read_changes("recommender", limit=2)] == ["6", "5"]

    assert change_feed.prune_changes(now=NOW) == 2
    assert list(Change.objects.order_by("id").values_list("object_id", flat=True)) == [
        "4", "3", "2", "1", "0"]
    assert [c.object_id for c in read_changes("recommender")] == ["4", "3", "2", "1", "0"]

    assert change_feed.prune_changes(now=NOW) == 2  # read now: past the retention, they go
    assert list(Change.objects.order_by("id").values_list("object_id", flat=True)) == [
        "2", "1", "0"]


def test_script_runs_older_than_the_retention_go(cluster, settings):
    settings.CLUSTERUI_SCRIPT_RUN_RETENTION_DAYS = 3
    node = NodeFactory(cluster=cluster)
    for day in WEEK:
        ScriptRun.objects.create(node=node, event=ScriptEvent.JOB_END, exit_code=0,
                                 duration_s=1.0, job_id=str(day), received_at=days_ago(day))
    assert startup_tasks.prune_script_runs() == 4
    assert sorted(ScriptRun.objects.values_list("job_id", flat=True)) == ["0", "1", "2"]


def test_closed_events_go_after_the_retention_but_a_repairs_evidence_stays(cluster, settings):
    settings.CLUSTERUI_CLOSED_EVENT_RETENTION_DAYS = 90
    node = NodeFactory(cluster=cluster)
    events = {}
    for day in (87, 88, 89, 90, 91, 92, 93):  # a week around the cutoff
        events[day] = HealthEvent.objects.create(
            node=node, signature=f"xid:{day}", severity="warning", source="agent",
            first_seen=days_ago(day + 1), last_seen=days_ago(day), closed_at=days_ago(day))
    still_open = HealthEvent.objects.create(
        node=node, signature="thermal_throttle", severity="warning", source="agent",
        first_seen=days_ago(200), last_seen=NOW)
    evidence = RepairFactory(node=node, requested_at=days_ago(92))
    evidence.events.add(events[92])

    assert health_tasks.prune_closed_events() == 3  # 90, 91 and 93 days ago
    kept = set(HealthEvent.objects.values_list("signature", flat=True))
    assert kept == {"xid:87", "xid:88", "xid:89", "xid:92", "thermal_throttle"}
    assert list(evidence.events.all()) == [events[92]]
    assert HealthEvent.objects.get(pk=still_open.pk).closed_at is None


def test_the_closed_event_retention_cannot_be_shorter_than_a_repair_cards_history():
    import subprocess
    import sys

    from tests.browser import REPO_ROOT, subprocess_env

    done = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"], cwd=REPO_ROOT,
        env=subprocess_env(DJANGO_SETTINGS_MODULE="clusterui.settings",
                           CLUSTERUI_CLOSED_EVENT_RETENTION_DAYS="30"),
        capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "CLUSTERUI_CLOSED_EVENT_RETENTION_DAYS must be at least 90" in done.stderr


def test_the_audit_trail_is_kept_unless_an_admin_sets_its_retention(cluster, settings):
    for day in WEEK:
        AuditEntry.objects.create(at=days_ago(day), actor_name="system",
                                  action=f"test.day{day}", object_type="test", object_id="1")
    settings.CLUSTERUI_AUDIT_RETENTION_DAYS = None
    assert cluster_tasks.prune_audit() == 0
    assert AuditEntry.objects.filter(action__startswith="test.").count() == 7

    settings.CLUSTERUI_AUDIT_RETENTION_DAYS = 3
    assert prune_audit(now=NOW) == 4
    assert sorted(AuditEntry.objects.filter(action__startswith="test.")
                  .values_list("action", flat=True)) == ["test.day0", "test.day1", "test.day2"]
