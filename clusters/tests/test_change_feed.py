"""The change feed: every reader gets every committed row once, also a row that commits
after rows with higher ids were read (PostgreSQL hands ids out before commit)."""

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from clusters import change_feed, tasks
from clusters.change_feed import GAP_FORGOTTEN_AFTER_S, Kind, read_changes, record_change
from clusters.models import Change, FeedCursor

pytestmark = pytest.mark.django_db(transaction=True)


def ids(rows):
    return [row.object_id for row in rows]


def test_each_reader_reads_each_row_once(cluster):
    record_change(Kind.REPAIR, cluster_id=cluster.pk, node_id=7, object_id="1")
    record_change(Kind.HEALTH_EVENT, cluster_id=cluster.pk, object_id="2")

    first = read_changes("publisher")
    assert [(row.kind, row.cluster_id, row.node_id, row.object_id) for row in first] == [
        ("repair", cluster.pk, 7, "1"), ("health_event", cluster.pk, None, "2")]
    assert read_changes("publisher") == []
    assert ids(read_changes("recommender")) == ["1", "2"]  # readers do not share a cursor
    record_change(Kind.REPAIR, cluster_id=cluster.pk, object_id="3")
    assert ids(read_changes("publisher")) == ["3"]
    assert ids(read_changes("recommender")) == ["3"]


class LateTransaction(threading.Thread):
    """Appends a change in a transaction of its own and commits (or rolls back) only when
    told: the id is handed out at once, the row appears at the end."""

    def __init__(self, cluster, object_id, *, commit=True):
        super().__init__()
        self.cluster, self.object_id, self.commit = cluster, object_id, commit
        self.inserted, self.finish = threading.Event(), threading.Event()
        self.error = None

    def run(self):
        try:
            with transaction.atomic():
                record_change(Kind.HEALTH_EVENT, cluster_id=self.cluster.pk,
                              object_id=self.object_id)
                self.inserted.set()
                self.finish.wait(10)
                if not self.commit:
                    transaction.set_rollback(True)
        except Exception as error:  # noqa: BLE001 - reported by the test
            self.error = error
            self.inserted.set()
        finally:
            connection.close()

    def end(self):
        self.finish.set()
        self.join(10)
        assert self.error is None


def reader_at_the_end(cluster, reader):
    """A reader that has been reading: it has read every row there is."""
    record_change(Kind.REPAIR, cluster_id=cluster.pk, object_id="before")
    assert ids(read_changes(reader)) == ["before"]


def test_a_row_that_commits_late_is_read_once_it_commits(cluster):
    assert connection.vendor == "postgresql", "make test runs the suite against PostgreSQL"
    reader_at_the_end(cluster, "publisher")
    late = LateTransaction(cluster, "late")
    late.start()
    assert late.inserted.wait(10)
    record_change(Kind.HEALTH_EVENT, cluster_id=cluster.pk, object_id="early")
    early_id = Change.objects.get(object_id="early").pk

    # The late row's id is below the one read, and it is not visible yet.
    assert ids(read_changes("publisher")) == ["early"]
    cursor = FeedCursor.objects.get(reader="publisher")
    assert cursor.last_id == early_id and str(early_id - 1) in cursor.gaps

    late.end()
    assert ids(read_changes("publisher")) == ["late"]  # a bare "id > cursor" loses it
    assert read_changes("publisher") == []
    assert FeedCursor.objects.get(reader="publisher").gaps == {}


def test_a_rolled_back_id_is_forgotten_after_a_while(cluster):
    reader_at_the_end(cluster, "publisher")
    rolled_back = LateTransaction(cluster, "never", commit=False)
    rolled_back.start()
    assert rolled_back.inserted.wait(10)
    record_change(Kind.REPAIR, cluster_id=cluster.pk, object_id="after")
    assert ids(read_changes("publisher", clock=lambda: 1000.0)) == ["after"]
    assert FeedCursor.objects.get(reader="publisher").gaps != {}
    rolled_back.end()

    assert read_changes("publisher", clock=lambda: 1001.0) == []
    assert FeedCursor.objects.get(reader="publisher").gaps != {}  # still waited for
    assert read_changes("publisher", clock=lambda: 1000.0 + GAP_FORGOTTEN_AFTER_S) == []
    assert FeedCursor.objects.get(reader="publisher").gaps == {}


def test_two_readers_of_one_name_at_once_get_each_row_once(cluster):
    """Two publishers around a lease handover, two deliveries of the recommender's task."""
    for n in range(3):
        record_change(Kind.REPAIR, cluster_id=cluster.pk, object_id=str(n))
    got = {}

    def other_reader():
        got["other"] = ids(read_changes("publisher"))
        connection.close()

    def clock_that_lets_the_other_read_first():
        # Called once this reader has read the rows, before it moves the cursor.
        thread = threading.Thread(target=other_reader)
        thread.start()
        thread.join(10)
        return 1000.0

    got["this"] = ids(read_changes("publisher", clock=clock_that_lets_the_other_read_first))
    assert got == {"other": ["0", "1", "2"], "this": []}
    assert read_changes("publisher") == []


def test_a_reader_whose_work_rolls_back_gets_the_same_rows_again(cluster):
    record_change(Kind.HEALTH_EVENT, cluster_id=cluster.pk, object_id="1")
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            assert ids(read_changes("recommender")) == ["1"]
            raise RuntimeError("the reader's work failed")
    assert ids(read_changes("recommender")) == ["1"]


def test_a_new_reader_starts_at_the_oldest_row_without_waiting_for_older_ids(cluster):
    """Ids below the oldest row were pruned (or flushed): not transactions still open."""
    for n in range(3):
        record_change(Kind.REPAIR, cluster_id=cluster.pk, object_id=str(n))
    Change.objects.filter(object_id="0").delete()
    assert ids(read_changes("new")) == ["1", "2"]
    assert FeedCursor.objects.get(reader="new").gaps == {}


def test_reads_are_limited_and_the_rest_comes_next(cluster):
    for n in range(5):
        record_change(Kind.REPAIR, cluster_id=cluster.pk, object_id=str(n))
    assert ids(read_changes("publisher", limit=3)) == ["0", "1", "2"]
    assert ids(read_changes("publisher", limit=3)) == ["3", "4"]


def test_old_rows_are_pruned_by_the_beat_task(cluster, settings):
    settings.CLUSTERUI_CHANGE_RETENTION_DAYS = 7
    now = timezone.now()
    record_change(Kind.REPAIR, cluster_id=cluster.pk, object_id="old",
                  now=now - timedelta(days=7, minutes=1))
    record_change(Kind.REPAIR, cluster_id=cluster.pk, object_id="recent",
                  now=now - timedelta(days=6))
    assert change_feed.prune_changes(now=now) == 1
    assert list(Change.objects.values_list("object_id", flat=True)) == ["recent"]
    assert tasks.prune_changes() == 0
