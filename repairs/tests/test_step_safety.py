"""A repair's steps under duplicate, concurrent and failing deliveries: one delivery claims a
step, a running step holds a lease, any error is retried with backoff and then fails the
repair, an operator aborts a running repair, and the blast-radius limit holds when repairs
start at once."""

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from clusters.models import AuditEntry
from nodes.choices import NodeState
from nodes.models import Node
from nodes.services import do_record_hello, do_register_node
from repairs import steps
from repairs.choices import Status, StepKind, StepStatus
from repairs.models import Repair, RepairSettings, RepairStep
from repairs.services import do_approve_repair, do_propose_repair, due_steps
from repairs.steps import Done, do_abort_repair
from repairs.transitions import Conflict



def running_repair(cluster, operator, name="gpu-009"):
    RepairSettings.objects.get_or_create(cluster=cluster, defaults={"provider": "simulated",
                                                                    "blast_radius_pct": 100})
    node = do_register_node(cluster, name)
    do_record_hello(node, boot_id="boot-1")
    repair = do_propose_repair(node, action="reboot", actor=operator, reason="test")
    return do_approve_repair(repair, actor=operator)


def first_step(repair):
    return RepairStep.objects.get(repair=repair, position=0)


@pytest.mark.django_db
def test_one_delivery_claims_a_step_and_another_gets_nothing_while_it_runs(
        cluster, operator, enqueued):
    repair = running_repair(cluster, operator)
    step, now = first_step(repair), timezone.now()

    assert steps.claim(step.pk, now, "delivery-a") is not None
    assert steps.claim(step.pk, now, "delivery-b") is None  # a duplicate: nothing twice
    # The same delivery again (its worker was lost, the broker gave it back): it goes on.
    assert steps.claim(step.pk, now, "delivery-a").attempts == 2
    # Its lease ran out (the worker died and the message with it): anyone takes it over.
    late = now + steps.lease_for(step) + timedelta(seconds=1)
    assert step.pk in due_steps(late)
    assert steps.claim(step.pk, late, "delivery-c").lease_holder == "delivery-c"


@pytest.mark.django_db
def test_a_step_done_or_of_a_repair_no_longer_running_is_not_claimed(cluster, operator,
                                                                    enqueued):
    repair = running_repair(cluster, operator)
    step = first_step(repair)
    RepairStep.objects.filter(pk=step.pk).update(status=StepStatus.DONE)
    assert steps.claim(step.pk, timezone.now(), "a") is None
    RepairStep.objects.filter(pk=step.pk).update(status=StepStatus.PENDING)
    Repair.objects.filter(pk=repair.pk).update(status=Status.FAILED)
    assert steps.claim(step.pk, timezone.now(), "a") is None


@pytest.mark.django_db(transaction=True)
def test_two_deliveries_at_once_run_the_step_once(cluster, operator, enqueued, monkeypatch):
    repair = running_repair(cluster, operator)
    step = first_step(repair)
    ran, both_claiming = [], threading.Barrier(2)

    def drain(repair, step, now):
        ran.append(step.pk)
        return Done("drained")

    monkeypatch.setitem(steps.STEP_FUNCTIONS, StepKind.DRAIN, drain)
    original_claim = steps.claim

    def claim_together(step_id, now, holder):
        both_claiming.wait(5)  # both read the step before either takes it
        return original_claim(step_id, now, holder)

    monkeypatch.setattr(steps, "claim", claim_together)

    def deliver(holder):
        try:
            steps.run_step(step.pk, holder=holder)
        finally:
            connection.close()

    threads = [threading.Thread(target=deliver, args=(f"delivery-{n}",)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert ran == [step.pk]
    step.refresh_from_db()
    assert (step.status, step.attempts, step.lease_holder) == (StepStatus.DONE, 1, "")


@pytest.mark.django_db
def test_any_error_is_tried_again_with_backoff_then_fails_the_repair(cluster, operator,
                                                                     enqueued, monkeypatch):
    repair = running_repair(cluster, operator)
    step = first_step(repair)

    def broken(repair, step, now):
        raise RuntimeError("connection to the database was lost")

    monkeypatch.setitem(steps.STEP_FUNCTIONS, StepKind.DRAIN, broken)
    now = timezone.now()
    waits = []
    for _ in range(steps.ERROR_RETRIES):
        outcome = steps.run_step(step.pk, now=now)
        waits.append(outcome.after.total_seconds())
        step.refresh_from_db()
        assert step.status == StepStatus.WAITING and "RuntimeError" in step.message
        now = step.next_check_at
    assert waits == [5, 10, 20, 40]

    outcome = steps.run_step(step.pk, now=now)
    assert isinstance(outcome, steps.Failed)
    repair.refresh_from_db()
    assert repair.status == Status.FAILED
    assert "error 5 times in a row" in repair.outcome and "database was lost" in repair.outcome
    node = Node.objects.get(pk=repair.node_id)
    assert node.paused and node.state == NodeState.PAUSED


@pytest.mark.django_db
def test_an_error_that_clears_starts_the_count_again(cluster, operator, enqueued,
                                                     monkeypatch):
    repair = running_repair(cluster, operator)
    step = first_step(repair)
    answers = iter([RuntimeError("blip"), steps.Wait("jobs still running")])

    def flaky(repair, step, now):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setitem(steps.STEP_FUNCTIONS, StepKind.DRAIN, flaky)
    steps.run_step(step.pk, now=timezone.now())
    step.refresh_from_db()
    steps.run_step(step.pk, now=step.next_check_at)
    step.refresh_from_db()
    assert step.details["errors"] == 0 and step.message == "jobs still running"


@pytest.mark.django_db
def test_an_operator_aborts_a_running_repair_and_keeps_the_node_paused(cluster, operator,
                                                                       enqueued):
    repair = running_repair(cluster, operator)
    step = first_step(repair)

    repair, said = do_abort_repair(repair, actor=operator, comment="wrong node",
                                   resume_node=False)

    assert repair.status == Status.ABORTED and repair.finished_at is not None
    assert repair.outcome == "aborted by alice: wrong node (node kept paused)"
    assert said == "gpu-009 stays paused."
    node = Node.objects.get(pk=repair.node_id)
    assert node.paused and "aborted: wrong node" in node.paused_reason
    assert node.running_repair == "" and node.state == NodeState.PAUSED
    entry = AuditEntry.objects.get(action="repair.abort")
    assert entry.actor == operator and entry.changes == {"comment": "wrong node",
                                                         "node": "kept paused"}
    assert steps.run_step(step.pk) is None  # nothing runs after it


@pytest.mark.django_db
def test_an_aborted_repair_may_resume_its_node_and_a_step_running_then_ends_there(
        cluster, operator, enqueued):
    repair = running_repair(cluster, operator)
    step = steps.claim(first_step(repair).pk, timezone.now(), "in-flight")

    repair, said = do_abort_repair(repair, actor=operator, comment="not needed",
                                   resume_node=True)
    assert said == "gpu-009 is back in service."
    node = Node.objects.get(pk=repair.node_id)
    assert not node.paused and node.state != NodeState.PAUSED

    enqueued.clear()
    steps.record_outcome(step, Done("drained"), timezone.now())  # the in-flight step ends
    assert enqueued == []  # and nothing follows it
    assert Repair.objects.get(pk=repair.pk).status == Status.ABORTED


@pytest.mark.django_db
def test_aborting_needs_a_reason_and_a_running_repair(cluster, operator, enqueued):
    repair = running_repair(cluster, operator)
    with pytest.raises(steps.RepairRefused, match="Say why"):
        do_abort_repair(repair, actor=operator, comment=" ", resume_node=False)
    second_operator_view = Repair.objects.get(pk=repair.pk)
    do_abort_repair(repair, actor=operator, comment="first", resume_node=False)
    with pytest.raises(Conflict):  # two operators at once: one wins
        do_abort_repair(second_operator_view, actor=operator, comment="second",
                        resume_node=False)
    assert Repair.objects.get(pk=repair.pk).outcome.startswith("aborted by alice: first")


@pytest.mark.django_db
def test_the_abort_button_of_a_running_repair(client_for, operator, viewer, cluster, enqueued):
    repair = running_repair(cluster, operator)
    url = reverse("repairs:abort", args=[cluster.slug, repair.public_id])
    tab = client_for(operator).get(reverse("repairs:list", args=[cluster.slug])).text
    assert f'action="{url}"' in tab and ">Abort</button>" in tab
    assert ">Abort</button>" not in client_for(viewer).get(
        reverse("repairs:list", args=[cluster.slug])).text

    refused = client_for(operator).post(url, {"comment": "", "node_after": "paused"},
                                        follow=True)
    assert "Say why the repair is aborted." in refused.text
    assert Repair.objects.get(pk=repair.pk).status == Status.RUNNING

    fragment = client_for(operator).post(url, {"comment": "wrong node", "node_after": "paused"},
                                         HTTP_HX_REQUEST="true")
    assert f'id="repair-{repair.public_id}"' in fragment.text and "Aborted" in fragment.text
    assert "repair-changed" in fragment.headers["HX-Trigger"]
    assert Repair.objects.get(pk=repair.pk).status == Status.ABORTED
    again = client_for(operator).post(url, {"comment": "twice", "node_after": "paused"},
                                      follow=True)
    assert f"Repair #{repair.pk} is aborted now: only a running repair can be aborted." \
        in again.text
    assert client_for(operator).get(url).status_code == 405
    assert client_for(viewer).post(url, {"comment": "x", "node_after": "paused"}).status_code == 403


@pytest.mark.django_db(transaction=True)
def test_repairs_starting_at_once_never_put_more_than_the_limit_out_of_service(
        cluster, operator, enqueued):
    """Eight operators (or workers) approve eight repairs at the same moment; the cluster's
    20 nodes and its 10 % limit allow two out of service."""
    RepairSettings.objects.create(cluster=cluster, provider="simulated", blast_radius_pct=10)
    repairs = []
    for n in range(20):
        node = do_register_node(cluster, f"gpu-{n:03d}")
        do_record_hello(node, boot_id="boot-1")
        if n < 8:
            repairs.append(do_propose_repair(node, action="reboot", actor=operator,
                                             reason="test"))
    together = threading.Barrier(len(repairs))

    def approve(repair):
        try:
            together.wait(5)
            do_approve_repair(repair, actor=operator)
        finally:
            connection.close()

    threads = [threading.Thread(target=approve, args=(repair,)) for repair in repairs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    statuses = list(Repair.objects.values_list("status", flat=True))
    assert statuses.count(Status.RUNNING) == 2
    assert statuses.count(Status.WAITING) == 6
