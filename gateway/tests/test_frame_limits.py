"""The limits' own arithmetic (gateway/frame_limits.py), on clocks the tests move: the frame
bucket, the new events per node and hour, and the wait a refused hello is told."""

from gateway.frame_limits import FrameBucket, HelloAdmission, NewEventCounts


def test_the_bucket_refills_at_its_rate_and_spreads_refusals_over_one_burst():
    now = [0.0]
    bucket = FrameBucket(rate_per_s=2.0, burst=3, clock=lambda: now[0])
    assert [bucket.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    waits = [bucket.take() for _ in range(6)]
    assert waits == [0.5, 1.0, 1.5, 2.0, 2.0, 2.0]  # a turn each, the debt at most a burst
    now[0] = 2.0
    assert bucket.take() == 0.0


def test_new_event_counts_start_again_each_hour():
    now = [3600.0 * 10 + 5]
    counts = NewEventCounts(clock=lambda: now[0])
    assert [counts.take(7, limit=2) for _ in range(3)] == [0.0, 0.0, 3595.0]
    counts.give_back(7)
    assert counts.take(7, limit=2) == 0.0
    now[0] = 3600.0 * 11
    assert counts.take(7, limit=2) == 0.0 and counts.take(8, limit=2) == 0.0


def test_a_refused_hello_is_told_to_come_back_when_the_backlog_says(monkeypatch):
    monkeypatch.setattr("gateway.frame_limits.random.uniform", lambda low, high: 1.0)
    now = [100.0]
    hellos = HelloAdmission(limit=2, retry_after_s=2.0, clock=lambda: now[0])
    assert hellos.admit("a") and hellos.admit("b") and not hellos.admit("agent-0")
    assert hellos.retry_after() == 2.0  # nothing finished yet: the floor
    for _ in range(20):  # 2 hellos a second finished over the window...
        hellos.done()
        hellos.in_hand += 1
        now[0] += 0.5
    assert not hellos.admit("agent-0")  # the one refused before comes again: counted once
    refused = sum(not hellos.admit(f"agent-{n}") for n in range(1, 15))  # 15 agents waiting
    assert refused == 14
    assert hellos.retry_after() == 7.5  # 15 waiting, 2 hellos finished a second
    assert not any(hellos.admit(f"extra-{n}") for n in range(100))
    assert hellos.retry_after() == 15.0  # 115 waiting: past the cap
    now[0] += 11  # the window passed: nothing finished, nobody refused
    assert hellos.retry_after() == 2.0
