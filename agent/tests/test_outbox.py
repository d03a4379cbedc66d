from agent.outbox import Outbox
from agent.protocol import event_frame


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
