"""The Celery queues (clusterui/settings.py): the periodic sweeps have a queue of their own,
the recommender another, the providers' long commands another, so none waits behind other
work."""

import pytest
from django.conf import settings

from clusterui.celery import app
from repairs.choices import Action, StepKind
from repairs.models import RepairStep
from repairs.services import enqueue_step, step_queue
from repairs.tests.factories import RepairFactory

SWEEPS = {"healthchecks.tasks.sweep_heartbeats", "nodes.tasks.refresh_due_node_states",
          "startup.tasks.end_overdue_boot_holds", "healthchecks.tasks.sweep_health_events",
          "healthchecks.tasks.expire_check_runs", "nodes.tasks.expire_commands",
          "repairs.tasks.advance_repairs"}
RECOMMENDER = {"repairs.tasks.recommend_from_changes", "repairs.tasks.sweep_recommendations"}


def queue_of(task, **options):
    return app.amqp.router.route(options, task)["queue"].name


def test_every_sweep_of_the_beat_runs_on_the_sweeps_queue_and_the_rest_on_the_default():
    beat = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert SWEEPS <= beat and RECOMMENDER <= beat
    for task in beat:
        expected = ("sweeps" if task in SWEEPS else "recommend" if task in RECOMMENDER
                    else "celery")
        assert queue_of(task) == expected, task


def test_the_notifiers_tick_cannot_hold_up_the_recommender():
    assert queue_of("notifications.tasks.notify") != queue_of(
        "repairs.tasks.recommend_from_changes")


def test_a_worker_without_queues_named_takes_all_five():
    assert sorted(app.amqp.queues) == ["celery", "notify", "provider", "recommend", "sweeps"]


@pytest.mark.parametrize("kind, action, queue", [
    (StepKind.ACT, Action.REPROVISION, "provider"),
    (StepKind.ACT, Action.FAILOVER, "provider"),
    (StepKind.ACT, Action.REMOVE, "provider"),
    (StepKind.ACT, Action.REBOOT, "celery"),  # the agent's command: quick to ask for
    (StepKind.DRAIN, Action.REPROVISION, "celery"),
    (StepKind.VERIFY, Action.REPROVISION, "celery"),
])
def test_a_providers_act_step_goes_to_the_provider_queue(kind, action, queue):
    assert step_queue(kind, action) == queue


@pytest.mark.django_db
def test_enqueueing_a_step_sends_it_to_its_queue_once_committed(
        monkeypatch, django_capture_on_commit_callbacks):
    repair = RepairFactory(action=Action.REPROVISION)
    step = RepairStep.objects.create(repair=repair, position=1, kind=StepKind.ACT)
    sent = []
    monkeypatch.setattr(app, "send_task", lambda name, args, queue: sent.append(
        (name, args, queue)))
    with django_capture_on_commit_callbacks(execute=True):
        enqueue_step(step.pk)
    assert sent == [("repairs.tasks.run_repair_step", [step.pk], "provider")]


def test_sending_a_notification_has_a_queue_of_its_own():
    assert queue_of("notifications.tasks.deliver") == "notify"
