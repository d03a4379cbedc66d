"""A rejection sticks (DESIGN.md "Repairs", repairs.rejections): over ten minutes of
recommender ticks nothing is proposed again for the same events; something new or costlier
is, and says what is new; a snooze ends; an operator asks again. Time is simulated: every
tick is called with `now=`."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from clusters.models import AuditEntry
from healthchecks.services import do_close_health_event, do_record_health_event
from nodes.services import do_pause_node
from nodes.tests.factories import GpuFactory, NodeFactory
from repairs.choices import Status
from repairs.services import (
    do_approve_repair,
    do_cancel_repair,
    do_recommend_again,
    do_reject_repair,
    recommend_from_changes,
    refresh_recommendation,
    refresh_recommendations,
    resolve_quiet_recommendations,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_tasks")]

NOW = timezone.now()



@pytest.fixture
def node(cluster):
    node = NodeFactory(cluster=cluster, name="gpu-011")
    for index in range(8):
        GpuFactory(node=node, index=index)
    return node


def open_event(node, signature, *, gpu=3, at=NOW, severity="critical"):
    gpu = node.gpus.get(index=gpu) if gpu is not None else None
    return do_record_health_event(node, signature=signature, severity=severity, gpu=gpu,
                                  message=signature, now=at)


def tick(at):
    """What beat runs: the change-feed recommender, the minute's sweep, the quiet resolver."""
    recommend_from_changes(now=at)
    refresh_recommendations(now=at)
    resolve_quiet_recommendations(now=at)


def ten_minutes_of_ticks(node, start, repeat="xid:79"):
    """A tick every 15 s for 10 minutes, the Xid repeating now and then (the same open
    event: its count rises)."""
    for step in range(1, 41):
        at = start + timedelta(seconds=15 * step)
        if repeat and step % 4 == 0:
            open_event(node, repeat, at=at)
        tick(at)


def rejected(node, operator, *, snooze=None, at=NOW):
    open_event(node, "xid:79", at=at)
    repair = refresh_recommendation(node, now=at)
    assert repair.action == "reboot"
    return do_reject_repair(repair, actor=operator, comment="job checkpoints at 03:00",
                            snooze=snooze, now=at)


def test_after_a_rejection_ten_minutes_of_ticks_propose_nothing(node, operator):
    repair = rejected(node, operator)
    ten_minutes_of_ticks(node, NOW)
    assert list(node.repairs.values_list("pk", flat=True)) == [repair.pk]
    assert repair.snooze_until is None  # until its events close


def test_a_cancelled_repair_sticks_too(cluster, node, operator):
    do_pause_node(NodeFactory(cluster=cluster), actor=operator, reason="reseating")
    open_event(node, "xid:79")
    repair = do_approve_repair(refresh_recommendation(node, now=NOW), actor=operator, now=NOW)
    assert repair.status == Status.WAITING  # the blast radius: one node out already
    repair = do_cancel_repair(repair, actor=operator, comment="wrong node", now=NOW)
    assert repair.status == Status.CANCELLED
    ten_minutes_of_ticks(node, NOW)
    assert node.repairs.count() == 1


def test_a_costlier_signature_breaks_through_and_says_what_is_new(node, operator):
    first = rejected(node, operator)
    ten_minutes_of_ticks(node, NOW)
    open_event(node, "xid:54", gpu=5, at=NOW + timedelta(minutes=11))  # CHECK_MECHANICALS
    tick(NOW + timedelta(minutes=11, seconds=15))
    repair = node.repairs.open().get()
    assert repair.action == "remove" and repair.follows == first
    assert repair.follows_why == (
        f"new since #{first.pk} (reboot) was rejected: xid:54 on GPU 5; remove is costlier "
        f"than the reboot that was rejected (#{first.pk})")


def test_a_new_signature_as_costly_breaks_through(node, operator):
    first = rejected(node, operator)
    open_event(node, "gpu_lost", gpu=6, at=NOW + timedelta(minutes=2))
    tick(NOW + timedelta(minutes=2, seconds=15))
    repair = node.repairs.open().get()
    assert repair.action == "reboot" and repair.follows == first
    assert repair.follows_why == f"new since #{first.pk} (reboot) was rejected: gpu_lost on GPU 6"


def test_a_chosen_one_hour_snooze_ends_and_the_recommendation_comes_back(node, operator):
    first = rejected(node, operator, snooze=timedelta(hours=1))
    assert first.snooze_until == NOW + timedelta(hours=1)
    ten_minutes_of_ticks(node, NOW)
    tick(NOW + timedelta(minutes=59))
    assert node.repairs.count() == 1
    tick(NOW + timedelta(minutes=61))
    again = node.repairs.open().get()
    assert again.action == "reboot" and again.signature == "xid:79"
    assert again.follows is None  # nothing new: the snooze ended


def test_once_its_events_close_a_new_one_of_the_same_signature_is_recommended(node, operator):
    first = rejected(node, operator)
    do_close_health_event(first.events.get(), reason="resolved by hand",
                          now=NOW + timedelta(minutes=3))
    open_event(node, "xid:79", at=NOW + timedelta(minutes=20))
    tick(NOW + timedelta(minutes=20, seconds=15))
    assert node.repairs.open().get().action == "reboot"


def test_an_operator_asks_again(node, operator):
    first = rejected(node, operator)
    again = do_recommend_again(node, actor=operator, now=NOW + timedelta(minutes=5))
    assert again.status == Status.PROPOSED and again.pk != first.pk
    first.refresh_from_db()
    assert first.snooze_until == NOW + timedelta(minutes=5)
    entry = AuditEntry.objects.get(action="repair.recommend_again")
    assert entry.actor == operator and entry.changes == {"snoozes_ended": [first.pk]}


def test_the_node_page_says_what_holds_it_back_and_asks_again(client_for, node, operator):
    rejected(node, operator, at=timezone.now())
    client = client_for(operator)
    section = client.get(reverse("repairs:node", args=[node.cluster.slug, node.name]),
                         HTTP_HX_REQUEST="true").text
    assert "No new recommendation for its open events" in section
    assert "until these events close" in section and "Recommend again" in section
    client.post(reverse("repairs:recommend_again", args=[node.cluster.slug, node.name]))
    assert node.repairs.open().get().action == "reboot"


def test_reject_with_a_snooze_from_the_card(client_for, node, operator):
    open_event(node, "xid:79", at=timezone.now())
    repair = refresh_recommendation(node)
    client = client_for(operator)
    card = client.get(reverse("repairs:list", args=[node.cluster.slug])).text
    assert "ask again until these events close" in card and "ask again for 24 h" in card
    before = timezone.now()
    client.post(reverse("repairs:reject", args=[node.cluster.slug, repair.public_id]),
                {"comment": "not now", "snooze": "24h"})
    repair.refresh_from_db()
    assert repair.status == Status.REJECTED
    assert before + timedelta(hours=24) <= repair.snooze_until <= timezone.now() + timedelta(hours=24)

