from celery import shared_task

from . import services, steps


@shared_task(acks_late=True, reject_on_worker_lost=True)
def run_repair_step(step_id):
    """One step of a running repair (repairs.steps); safe to run again."""
    steps.run_step(step_id)


@shared_task
def advance_repairs():
    """Beat, every 5 s: waiting steps whose time has come run again, waiting repairs start
    when the blast-radius limit allows, and recommendations follow the open events."""
    return {
        "due_steps": steps.run_due_steps(),
        "started": services.start_waiting_repairs(),
        "recommended_resolved": services.refresh_recommendations(),
    }


@shared_task
def recommend_repair(node_id):
    """A health event opened on the node: recommend a repair now rather than at the next
    beat."""
    from nodes.models import Node

    node = Node.objects.filter(pk=node_id).first()
    if node is not None:
        services.refresh_recommendation(node)
