"""One beat per deployment (clusterui/beat.py): a second `celery beat` stands by, sends
nothing, and takes over when the first stops."""

import os
import time
import uuid

import pytest

from clusterui.beat import FileBeatLock, RedisBeatLock

from .integration import wait_until

pytestmark = pytest.mark.integration

SENT = "Sending due task"


def test_a_second_beat_stands_by_and_takes_over_when_the_first_stops(processes, tmp_path):
    key = f"clusterui:beat:test-{uuid.uuid4().hex}"  # not the suite's other beats'
    first = processes.celery("beat", "-s", tmp_path / "first", "--max-interval", "1",
                             name="first-beat", CLUSTERUI_BEAT_LOCK=key)
    wait_until(lambda: SENT in first.log_text(), timeout=60, what="the first beat sends")
    second = processes.celery("beat", "-s", tmp_path / "second", "--max-interval", "1",
                              name="second-beat", CLUSTERUI_BEAT_LOCK=key)
    wait_until(lambda: "standing by" in second.log_text(), timeout=60,
               what="the second beat stands by")
    time.sleep(3)  # the schedule has tasks due every second
    assert SENT not in second.log_text()

    first.stop()
    assert "Shutting down" in first.log_text() or not first.running()
    wait_until(lambda: SENT in second.log_text(), timeout=15,
               what="the second beat takes over once the first released the lock")


def test_the_redis_lock_is_held_by_one_renewed_and_handed_over():
    url = os.environ.get("REDIS_URL")
    if not url:
        pytest.skip("needs Redis: run it with `make test`")
    key = f"clusterui:beat:test-{uuid.uuid4().hex}"
    first, second = RedisBeatLock(url, key), RedisBeatLock(url, key)
    assert first.hold() is True
    assert second.hold() is False
    assert first.hold() is True  # renewed
    first.client.pexpire(key, 1)  # as if the holder died and its lock ran out
    time.sleep(0.05)
    assert second.hold() is True
    assert first.hold() is False
    second.release()
    assert first.hold() is True
    first.release()


def test_the_embedded_file_lock_is_held_by_one_and_freed_on_release(tmp_path):
    first, second = FileBeatLock(tmp_path / "beat.lock"), FileBeatLock(tmp_path / "beat.lock")
    assert first.hold() is True and first.hold() is True
    assert second.hold() is False
    first.release()
    assert second.hold() is True
    second.release()
