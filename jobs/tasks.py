from celery import shared_task

from . import services


@shared_task
def import_jobs():
    """Beat, every minute: every Slurm cluster's jobs from sacct into the database."""
    return {slug: result.error or f"{result.created} new, {result.updated} updated"
            for slug, result in services.import_all_clusters().items()}
