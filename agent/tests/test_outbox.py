import json
import sqlite3

from agent.connection.outbox import Outbox
from agent.connection.protocol import event_frame


def make_event(signature="xid:79"):
    return event_frame(signature=signature, severity="critical", message="test", gpu_uuid="GPU-1")


def test_events_survive_reopening(tmp_path):
    path = tmp_path / "outbox.sqlite3"
    outbox = Outbox(path)
    first, second = make_event("xid:79"), make_event("gpu_lost")
    outbox.add(first)
    outbox.add(second)
    outbox.close()

    reopened = Outbox(path)

    assert reopened.pending() == [first, second]
    assert len(reopened) == 2


def test_pending_is_oldest_first(tmp_path):
    outbox = Outbox(tmp_path / "outbox.sqlite3")
    events = [make_event(f"xid:{code}") for code in (13, 79, 48, 31, 94)]
    for event in events:
        outbox.add(event)

    assert [e["id"] for e in outbox.pending()] == [e["id"] for e in events]


def test_an_ack_removes_exactly_the_named_events(tmp_path):
    outbox = Outbox(tmp_path / "outbox.sqlite3")
    events = [make_event() for _ in range(3)]
    for event in events:
        outbox.add(event)

    removed = outbox.remove([events[0]["id"], events[2]["id"], "not-an-id-we-have"])

    assert removed == 2
    assert outbox.pending() == [events[1]]


def test_an_ack_is_kept_after_reopening(tmp_path):
    path = tmp_path / "outbox.sqlite3"
    outbox = Outbox(path)
    kept, acked = make_event(), make_event()
    outbox.add(kept)
    outbox.add(acked)
    outbox.remove([acked["id"]])
    outbox.close()

    assert Outbox(path).pending() == [kept]


def test_dropping_a_refused_event_keeps_the_rest_in_order(tmp_path):
    outbox = Outbox(tmp_path / "outbox.sqlite3")
    events = [make_event() for _ in range(4)]
    for event in events:
        outbox.add(event)

    assert outbox.get(events[1]["id"]) == events[1]
    outbox.remove([events[1]["id"]])

    assert outbox.get(events[1]["id"]) is None
    assert outbox.pending() == [events[0], events[2], events[3]]


def test_adding_the_same_event_twice_keeps_one(tmp_path):
    outbox = Outbox(tmp_path / "outbox.sqlite3")
    event = make_event()
    outbox.add(event)
    outbox.add(event)

    assert outbox.pending() == [event]


def frame_size(event):
    return len(json.dumps(event))


def test_a_full_outbox_drops_the_oldest_info_events_first_then_the_oldest(tmp_path):
    # All of one size: "info" and a message longer by what "critical" is longer.
    info = [event_frame(signature="xid:79", severity="info", message="test" + "....",
                        gpu_uuid="GPU-1") for _ in range(3)]
    warnings = [make_event() for _ in range(3)]
    newer = [make_event() for _ in range(4)]
    for event in info + warnings + newer:
        event["ts"] = 1764442000.5  # the same length in every frame
    assert len({frame_size(e) for e in info + warnings + newer}) == 1
    size = max(map(frame_size, info + warnings))
    outbox = Outbox(tmp_path / "outbox.sqlite3", max_bytes=6 * size)
    for event in [warnings[0], info[0], warnings[1], info[1], warnings[2], info[2]]:
        assert outbox.add(event) == 0
    assert [outbox.add(event) for event in newer] == [1, 1, 1, 1]
    kept = [event["id"] for event in outbox.pending()]
    # The three info events went first, then the oldest warning.
    assert kept == [warnings[1]["id"], warnings[2]["id"], *(e["id"] for e in newer)]
    assert outbox.dropped() == 4


def test_the_dropped_count_survives_a_restart_and_starts_again_once_told(tmp_path):
    path = tmp_path / "outbox.sqlite3"
    event = make_event()
    outbox = Outbox(path, max_bytes=frame_size(event) + 10)
    outbox.add(event)
    outbox.add(make_event())
    outbox.close()
    reopened = Outbox(path, max_bytes=10_000)
    assert reopened.dropped() == 1
    reopened.add(make_event())  # room enough: nothing dropped
    reopened.told(1)
    assert reopened.dropped() == 0


def test_an_outbox_from_before_the_bound_is_read_and_bounded(tmp_path):
    path = tmp_path / "outbox.sqlite3"
    old = sqlite3.connect(path, isolation_level=None)
    old.execute("CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL"
                " UNIQUE, frame TEXT NOT NULL)")
    event = make_event()
    old.execute("INSERT INTO events (id, frame) VALUES (?, ?)", (event["id"], json.dumps(event)))
    old.close()
    outbox = Outbox(path, max_bytes=frame_size(event) + 10)
    assert outbox.pending() == [event]
    assert outbox.add(make_event()) == 1 and len(outbox) == 1


def test_an_ack_gives_its_room_back(tmp_path):
    event = make_event()
    outbox = Outbox(tmp_path / "outbox.sqlite3", max_bytes=2 * frame_size(event) + 10)
    outbox.add(event)
    outbox.add(make_event())
    outbox.remove([event["id"]])
    assert outbox.add(make_event()) == 0 and len(outbox) == 2
