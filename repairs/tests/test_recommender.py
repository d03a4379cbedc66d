"""The recommender's tick (recommend_from_changes) under a storm of events: each node whose
events opened or closed is looked at once, a repeat counted is no reason to look, a node
whose problems call for no repair is not locked, and each node is refreshed in its own
transaction (one for them all held every node's row until the last was done)."""

import threading

import pytest
from django.db import connection, transaction

from clusters.change_feed import read_changes
from healthchecks.services import do_record_health_event
from nodes.models import Node
from nodes.tests.factories import GpuFactory, NodeFactory
from repairs import services
from repairs.choices import Action
from repairs.models import Repair
from repairs.services import RECOMMENDER, recommend_from_changes


@pytest.fixture
def refreshed(monkeypatch):
    """Node ids refresh_recommendation() was called for, in order."""
    seen = []
    original = services.refresh_recommendation

    def spy(node, now=None):
        seen.append(node.pk)
        return original(node, now=now)

    monkeypatch.setattr(services, "refresh_recommendation", spy)
    return seen


def xid_79(node):
    return do_record_health_event(node, signature="xid:79", severity="critical",
                                  gpu=GpuFactory(node=node, index=3))


@pytest.mark.django_db
def test_each_node_whose_events_opened_is_looked_at_once(refreshed):
    read_changes(RECOMMENDER)  # the feed read up to now
    broken, throttled = NodeFactory(name="gpu-001"), NodeFactory(name="gpu-002")
    xid_79(broken)
    for _ in range(3):
        xid_79_again = do_record_health_event(broken, signature="xid:79", severity="critical",
                                              gpu=broken.gpus.get())
        assert xid_79_again.count > 1
    do_record_health_event(throttled, signature="thermal_throttle", severity="warning")

    assert recommend_from_changes() == 1

    (repair,) = Repair.objects.all()
    assert (repair.node, repair.action) == (broken, Action.REBOOT)
    # The throttled node's throttling has not persisted: nothing to recommend, no lock.
    assert refreshed == [broken.pk]


@pytest.mark.django_db
def test_repeats_counted_are_no_reason_to_look_again(refreshed):
    broken = NodeFactory()
    event = xid_79(broken)
    recommend_from_changes()
    refreshed.clear()

    for _ in range(5):
        do_record_health_event(broken, signature="xid:79", severity="critical", gpu=event.gpu)

    assert recommend_from_changes() == 0
    assert refreshed == []


@pytest.mark.django_db(transaction=True)
def test_each_node_is_refreshed_in_a_transaction_of_its_own(refreshed, monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL's row locks: run it with `make test`")
    read_changes(RECOMMENDER)
    first, second = NodeFactory(name="gpu-001"), NodeFactory(name="gpu-002")
    xid_79(first)
    xid_79(second)
    original = services.refresh_recommendation
    first_locked_meanwhile = []

    def refresh(node, now=None):
        if node.pk == second.pk:  # is the first node's row still held?
            def try_lock():
                try:
                    with transaction.atomic():
                        Node.objects.select_for_update(nowait=True).get(pk=first.pk)
                    first_locked_meanwhile.append(False)
                except Exception:  # noqa: BLE001 - the lock was held
                    first_locked_meanwhile.append(True)
                finally:
                    connection.close()

            other = threading.Thread(target=try_lock)
            other.start()
            other.join(10)
        return original(node, now=now)

    monkeypatch.setattr(services, "refresh_recommendation", refresh)

    assert recommend_from_changes() == 2
    assert first_locked_meanwhile == [False]
