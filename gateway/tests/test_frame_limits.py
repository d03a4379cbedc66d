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


def test_refused_hellos_are_given_turns_at_the_pace_hellos_finish(monkeypatch):
    monkeypatch.setattr("gateway.frame_limits.random.uniform", lambda low, high: low)
    now = [100.0]
    hellos = HelloAdmission(limit=4, seconds_of_work=2.0, clock=lambda: now[0])
    assert all(hellos.admit() for _ in range(4)) and not hellos.admit()
    # Nothing finished yet: the pace the limit was sized for, 4 hellos in 2 s.
    assert [hellos.retry_after() for _ in range(3)] == [0.5, 1.0, 1.5]
    for _ in range(40):  # then 10 hellos a second finished, for 4 s
        hellos.done()
        hellos.in_hand += 1
        now[0] += 0.1
    # The turns given before have passed; the next come 0.1 s apart from now.
    assert [hellos.retry_after() for _ in range(3)] == [0.5, 0.5, 0.5]  # at least the floor
    turns = [hellos.retry_after() for _ in range(200)]
    assert turns[:4] == [0.5, 0.5, 0.6, 0.7]
    assert turns[145:147] == [14.9, 15.0]
    # Past 15 s a turn is not given: half to all of the cap, then ask again.
    assert turns[147:] == [7.5] * 53
    now[0] += 11  # the window passed with nothing finished: the sized pace again,
    assert hellos.finished_per_s() == 2.0
    assert hellos.retry_after() == 4.5  # after the turns already given (the last 15 s)
    now[0] += 20
    assert hellos.retry_after() == 0.5
