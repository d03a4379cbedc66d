"""The import service against sacct output captured from the test harness's real Slurm
(fixtures/); sacct itself is the one thing patched here (tests/test_jobs_accounting.py runs
the real one)."""

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from jobs import services
from jobs.models import ImportCursor, Job, JobNode
from jobs.services import do_import_jobs
from schedulers import ExecutorError

FIXTURES = Path(__file__).parent / "fixtures"
NOW = datetime(2026, 11, 30, 0, 47, tzinfo=timezone.utc)

pytestmark = pytest.mark.django_db


class FakeSacct:
    """Answers run_sacct with a fixture (or raises), remembering each window asked for."""

    def __init__(self, monkeypatch, name):
        self.output = (FIXTURES / name).read_text()
        self.error = None
        self.windows = []
        monkeypatch.setattr(services, "run_sacct", self)

    def __call__(self, slurm_conf, since, until):
        self.windows.append((since, until))
        if self.error:
            raise self.error
        return self.output


def snapshot(cluster):
    fields = ("job_id", *Job.SACCT_FIELDS, "imported_at", "updated_at")
    return (sorted(Job.objects.filter(cluster=cluster).values_list(*fields)),
            sorted(JobNode.objects.filter(job__cluster=cluster)
                   .values_list("job__job_id", "node_name")))


def test_it_imports_every_job_with_its_nodes(monkeypatch, cluster):
    FakeSacct(monkeypatch, "sacct_finished.txt")
    result = do_import_jobs(cluster, now=NOW)
    assert (result.created, result.updated, result.error) == (8, 0, "")
    two = Job.objects.get(cluster=cluster, job_id="3")
    assert (two.user, two.account, two.gpus, two.node_list) == ("capbob", "vision", 8, "gpu-[001-002]")
    assert set(two.job_nodes.values_list("node_name", flat=True)) == {"gpu-001", "gpu-002"}
    assert ImportCursor.objects.get(cluster=cluster).imported_until == NOW


def test_importing_twice_changes_nothing(monkeypatch, cluster):
    FakeSacct(monkeypatch, "sacct_finished.txt")
    do_import_jobs(cluster, now=NOW)
    before = snapshot(cluster)
    result = do_import_jobs(cluster, now=NOW + timedelta(minutes=1))
    assert (result.created, result.updated) == (0, 0)
    assert snapshot(cluster) == before


def test_a_running_job_is_updated_when_it_ends(monkeypatch, cluster):
    sacct = FakeSacct(monkeypatch, "sacct_running.txt")
    do_import_jobs(cluster, now=NOW)
    long = Job.objects.get(cluster=cluster, job_id="5")
    assert (long.state, long.end) == ("RUNNING", None)
    pending = Job.objects.get(cluster=cluster, job_id="6")
    assert pending.job_nodes.count() == 0

    sacct.output = (FIXTURES / "sacct_finished.txt").read_text()
    result = do_import_jobs(cluster, now=NOW + timedelta(minutes=1))
    assert (result.created, result.updated) == (0, 2)
    long.refresh_from_db()
    assert long.state == "CANCELLED by 0"
    assert long.end == datetime(2026, 11, 30, 0, 46, 26, tzinfo=timezone.utc)
    assert long.elapsed_s == 9
    assert Job.objects.filter(cluster=cluster).count() == 8


def test_the_window_reaches_back_to_the_oldest_running_job(monkeypatch, cluster):
    sacct = FakeSacct(monkeypatch, "sacct_running.txt")
    do_import_jobs(cluster, now=NOW + timedelta(hours=2))
    # Hours later the job that was running then is still unfinished here: sacct is asked
    # from its start, not from the cursor, so it is read until it ends.
    later = NOW + timedelta(hours=5)
    do_import_jobs(cluster, now=later)
    since, until = sacct.windows[-1]
    assert since == datetime(2026, 11, 30, 0, 46, 17, tzinfo=timezone.utc)
    assert until == later


def test_the_next_import_resumes_from_the_cursor_less_the_overlap(monkeypatch, cluster):
    sacct = FakeSacct(monkeypatch, "sacct_finished.txt")
    do_import_jobs(cluster, now=NOW)
    do_import_jobs(cluster, now=NOW + timedelta(hours=1))
    assert sacct.windows[0][0] == NOW - timedelta(days=30)
    assert sacct.windows[1] == (NOW - services.OVERLAP, NOW + timedelta(hours=1))


def test_a_failed_sacct_leaves_the_cursor_and_records_the_error(monkeypatch, cluster):
    sacct = FakeSacct(monkeypatch, "sacct_finished.txt")
    do_import_jobs(cluster, now=NOW)
    sacct.error = ExecutorError("sacct exited with status 1: Connection refused")
    result = do_import_jobs(cluster, now=NOW + timedelta(hours=1))
    assert "Connection refused" in result.error
    cursor = ImportCursor.objects.get(cluster=cluster)
    assert cursor.imported_until == NOW and cursor.last_success_at == NOW
    assert "Connection refused" in cursor.last_error
    assert cursor.last_attempt_at == NOW + timedelta(hours=1)

    sacct.error = None
    do_import_jobs(cluster, now=NOW + timedelta(hours=2))
    # The failed hour is read again.
    assert sacct.windows[-1][0] == NOW - services.OVERLAP
    cursor.refresh_from_db()
    assert cursor.last_error == "" and cursor.imported_until == NOW + timedelta(hours=2)


def test_a_line_it_cannot_read_is_a_warning_and_the_rest_is_imported(monkeypatch, cluster):
    sacct = FakeSacct(monkeypatch, "sacct_finished.txt")
    sacct.output += "garbage line\n"
    result = do_import_jobs(cluster, now=NOW)
    assert (result.error, result.warnings) == ("", 1)
    assert Job.objects.filter(cluster=cluster).count() == 8
    cursor = ImportCursor.objects.get(cluster=cluster)
    assert cursor.imported_until == NOW and cursor.last_warning_count == 1
    [warning] = cursor.last_warnings
    assert warning.startswith("line 9: 1 fields, not 12: garbage line")
    sacct.output = sacct.output.replace("garbage line\n", "")
    do_import_jobs(cluster, now=NOW)  # a clean import clears them
    cursor.refresh_from_db()
    assert (cursor.last_warning_count, cursor.last_warnings) == (0, [])
