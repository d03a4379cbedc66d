"""The status table, pair by pair, and the conditional update behind it."""

import itertools

import pytest

from repairs.choices import Status
from repairs.models import RepairTransition
from repairs.tests.factories import RepairFactory
from repairs.transitions import ALLOWED, Conflict, InvalidTransition, transition

pytestmark = pytest.mark.django_db

# DESIGN.md's table, written out again on purpose: the test is the second reading.
EXPECTED = {
    ("proposed", "approved"), ("proposed", "rejected"), ("proposed", "resolved"),
    ("proposed", "superseded"), ("proposed", "cancelled"),
    ("approved", "waiting"), ("approved", "running"), ("approved", "cancelled"),
    ("waiting", "running"), ("waiting", "cancelled"),
    ("running", "succeeded"), ("running", "failed"), ("running", "aborted"),
}


@pytest.mark.parametrize("before,after", list(itertools.product(Status.values, Status.values)))
def test_every_pair_of_statuses(before, after, operator):
    repair = RepairFactory(status=before)
    if (before, after) in EXPECTED:
        moved = transition(repair, after, actor=operator, reason="table")
        assert moved.status == after
        row = RepairTransition.objects.get(repair=repair)
        assert (row.from_status, row.to_status, row.actor, row.actor_name, row.reason) == (
            before, after, operator, "alice", "table")
    else:
        with pytest.raises(InvalidTransition):
            transition(repair, after, actor=operator)
        repair.refresh_from_db()
        assert repair.status == before and not RepairTransition.objects.exists()


def test_the_table_in_code_is_the_expected_one():
    assert {(a, b) for a, targets in ALLOWED.items() for b in targets} == EXPECTED


def test_a_repair_moved_by_someone_else_meanwhile_is_a_conflict(operator, admin):
    repair = RepairFactory(status=Status.PROPOSED)
    stale = type(repair).objects.get(pk=repair.pk)
    transition(repair, Status.APPROVED, actor=operator)
    with pytest.raises(Conflict, match="is approved now"):
        transition(stale, Status.REJECTED, actor=admin)
    assert RepairTransition.objects.count() == 1


def test_fields_move_with_the_status_in_one_update(operator):
    repair = RepairFactory(status=Status.PROPOSED)
    moved = transition(repair, Status.APPROVED, actor=operator, review_comment="go",
                       reviewed_by=operator)
    assert moved.review_comment == "go" and moved.reviewed_by == operator
