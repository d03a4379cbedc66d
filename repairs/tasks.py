from celery import shared_task

from . import services, steps


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True)
def run_repair_step(self, step_id):
    """One step of a running repair (repairs.steps); safe to deliver again and at once: the
    delivery (its task id) claims the step."""
    steps.run_step(step_id, holder=self.request.id or "")


@shared_task
def advance_repairs():
    """Beat, every 5 s: waiting steps whose time has come run again, waiting repairs start
    when the blast-radius limit allows, and proposals whose events stayed closed resolve."""
    return {
        "due_steps": steps.run_due_steps(),
        "started": services.start_waiting_repairs(),
        "resolved": services.resolve_quiet_recommendations(),
    }


@shared_task
def recommend_from_changes():
    """Beat, every second: the recommender reads the health changes of the change feed."""
    return services.recommend_from_changes()


@shared_task
def sweep_recommendations():
    """Beat, every minute: recommendations that time alone makes due (a cooldown ended)."""
    return services.refresh_recommendations()
