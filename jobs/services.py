"""Import a cluster's jobs from Slurm's accounting into Job rows.

    do_import_jobs(cluster)   # ImportResult(created=3, updated=1, error="")

Incremental: each import asks sacct for the jobs active since the cursor (less OVERLAP, for
sacct's lag behind slurmctld) or since the start of the oldest job still running here, so
running jobs are re-read until they end. Idempotent: a job whose fields did not change is
not written. The cursor moves in the same transaction as the rows, so an import that fails
or is killed leaves it where the stored rows are.
"""

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Min, Q
from django.utils import timezone

from clusters.models import Cluster
from schedulers import ExecutorError

from .models import ImportCursor, Job, JobNode
from .sacct import parse_sacct, run_sacct

logger = logging.getLogger(__name__)

# sacct lags slurmctld by seconds; a job that ended just before the last import may reach
# slurmdbd after it. Re-reading this much before the cursor costs nothing (idempotent).
OVERLAP = timedelta(minutes=10)
CHUNK = 500
MAX_WARNINGS = 20  # kept for the Jobs page, of each import


@dataclass(frozen=True)
class ImportResult:
    created: int = 0
    updated: int = 0
    warnings: int = 0  # sacct lines not read (ImportCursor.last_warnings shows them)
    error: str = ""


def slurm_clusters():
    """Clusters whose scheduler is Slurm (each with the slurm.conf the console uses)."""
    return Cluster.objects.filter(scheduler=Cluster.Scheduler.SLURM)


def import_window(cluster, cursor, now):
    """[since, until] for the next sacct call."""
    if cursor.imported_until is None:
        since = now - timedelta(days=settings.CLUSTERUI_JOBS_BACKFILL_DAYS)
    else:
        since = cursor.imported_until - OVERLAP
    oldest_running = Job.objects.filter(
        cluster=cluster, end__isnull=True, start__isnull=False).aggregate(m=Min("start"))["m"]
    if oldest_running is not None and oldest_running < since:
        since = oldest_running
    return since, now


def do_import_jobs(cluster: Cluster, *, slurm_conf=None,
                   now: datetime | None = None) -> ImportResult:
    """Import the cluster's jobs from sacct (with SLURM_CONF=slurm_conf when given)."""
    now = (now or timezone.now()).replace(microsecond=0)
    cursor, _ = ImportCursor.objects.get_or_create(cluster=cluster)
    since, until = import_window(cluster, cursor, now)
    try:
        jobs, warnings = parse_sacct(run_sacct(slurm_conf, since, until))
    except ExecutorError as exc:
        logger.warning("job import of %s failed: %s", cluster.slug, exc)
        ImportCursor.objects.filter(pk=cursor.pk).update(
            last_attempt_at=now, last_error=str(exc)[:2000])
        return ImportResult(error=str(exc))
    with transaction.atomic():
        created, updated = store_jobs(cluster, jobs, now)
        ImportCursor.objects.filter(pk=cursor.pk).update(
            last_attempt_at=now, last_success_at=now, last_error="",
            last_warnings=warnings[:MAX_WARNINGS], last_warning_count=len(warnings))
        # Only forward: a slower import that started earlier must not move it back.
        ImportCursor.objects.filter(pk=cursor.pk).filter(
            Q(imported_until__isnull=True) | Q(imported_until__lt=until)).update(
            imported_until=until)
    if warnings:
        logger.warning("job import of %s: %d sacct lines not read, the first: %s",
                       cluster.slug, len(warnings), warnings[0])
    return ImportResult(created=created, updated=updated, warnings=len(warnings))


def store_jobs(cluster, sacct_jobs, now):
    """Insert new jobs, update changed ones, leave equal ones alone; (created, updated)."""
    by_id = {j.job_id: j for j in sacct_jobs}
    ids = list(by_id)
    existing = {}
    for i in range(0, len(ids), CHUNK):
        for job in Job.objects.filter(cluster=cluster, job_id__in=ids[i:i + CHUNK]):
            existing[job.job_id] = job
    new, changed = [], []
    for job_id, sj in by_id.items():
        values = {field: getattr(sj, field) for field in Job.SACCT_FIELDS}
        job = existing.get(job_id)
        if job is None:
            new.append(Job(cluster=cluster, job_id=job_id, **values))
        elif any(getattr(job, f) != v for f, v in values.items()):
            for field, value in values.items():
                setattr(job, field, value)
            job.updated_at = now
            changed.append(job)
    Job.objects.bulk_create(new, batch_size=CHUNK)
    Job.objects.bulk_update(changed, [*Job.SACCT_FIELDS, "updated_at"], batch_size=CHUNK)
    touched = [j.job_id for j in new] + [j.job_id for j in changed]
    pks = {}
    for i in range(0, len(touched), CHUNK):
        pks.update(Job.objects.filter(cluster=cluster, job_id__in=touched[i:i + CHUNK])
                   .values_list("job_id", "pk"))
    # A pending job gets its nodes when it starts; node lists do not change after that.
    JobNode.objects.bulk_create(
        [JobNode(job_id=pks[job_id], node_name=name)
         for job_id in touched for name in by_id[job_id].nodes],
        ignore_conflicts=True, batch_size=CHUNK)
    return len(new), len(changed)


def import_all_clusters():
    """Import every Slurm cluster's jobs; {slug: ImportResult}."""
    return {cluster.slug: do_import_jobs(cluster, slurm_conf=cluster.scheduler_config or None)
            for cluster in slurm_clusters()}
