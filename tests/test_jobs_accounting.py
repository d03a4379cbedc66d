"""Job accounting against the real Slurm (slurmctld + slurmdbd + MariaDB, tests/slurm.py):
jobs run by sbatch and srun as two users in two accounts with GPUs; the Jobs page's
GPU-hours and cost per user and account equal what sacct reports; imports in new processes,
with slurmdbd stopped and restarted between them, lose and duplicate nothing."""

import re
import subprocess
import sys
import time
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from decimal import ROUND_HALF_UP, Decimal

import pytest
from django.urls import reverse

from clusters.models import Cluster
from clusters.roles import Role
from clusters.tests.factories import ClusterFactory, UserFactory
from jobs.models import ImportCursor, Job, JobNode
from jobs.services import do_import_jobs
from repairs.models import RepairSettings

from .browser import REPO_ROOT
from .integration import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

RATE = Decimal("2.5000")
UTC_FORMAT = "%Y-%m-%dT%H:%M:%S"


def sacct(slurm, since, *fields):
    """sacct's own rows since `since`, as lists of the fields asked for."""
    result = subprocess.run(
        ["sacct", "-a", "-X", "-P", "-n", f"--format={','.join(fields)}",
         "-S", since.strftime(UTC_FORMAT), "-E", "now"],
        env={**slurm.env, "TZ": "UTC"}, capture_output=True, text=True, timeout=30, check=True)
    return [line.split("|") for line in result.stdout.splitlines() if line]


def elapsed_seconds(text):
    days, _, clock = text.rpartition("-")
    h, m, s = (int(x) for x in clock.split(":"))
    return (int(days) if days else 0) * 86400 + h * 3600 + m * 60 + s


def gpus(tres):
    match = re.search(r"(?:^|,)gres/gpu=(\d+)", tres)
    return int(match[1]) if match else 0


def expected_usage(slurm, since):
    """{"user": {name: gpu_seconds}, "account": {...}} from sacct's Elapsed x AllocTRES."""
    usage = {"user": defaultdict(int), "account": defaultdict(int)}
    for user, account, tres, elapsed in sacct(slurm, since, "User", "Account", "AllocTRES",
                                              "Elapsed"):
        seconds = gpus(tres) * elapsed_seconds(elapsed)
        if seconds:
            usage["user"][user] += seconds
            usage["account"][account] += seconds
    return usage


def page_usage(html, table_id):
    table = html.split(f'id="{table_id}"')[1].split("</table>")[0]
    return {m[0]: (m[1], m[2]) for m in re.findall(
        r'<tr data-\w+="([^"]*)">.*?data-gpu-hours>([^<]*)<.*?data-cost>([^<]*)<', table)}


def as_page(gpu_seconds):
    hours = (Decimal(gpu_seconds) / 3600).quantize(Decimal("0.01"), ROUND_HALF_UP)
    cost = (Decimal(gpu_seconds) * RATE / 3600).quantize(Decimal("0.01"), ROUND_HALF_UP)
    return str(hours), str(cost)


def import_in_a_new_process(env, slug):
    return subprocess.run([sys.executable, "manage.py", "import_jobs", "--cluster", slug],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)


def all_finished(slurm, since, job_ids):
    rows = {job_id: end for job_id, end in sacct(slurm, since, "JobID", "End")}
    return all(rows.get(job_id, "Unknown") != "Unknown" for job_id in job_ids)


def stored_jobs(cluster):
    return {j.job_id: j for j in Job.objects.filter(cluster=cluster)}


def test_imports_survive_restarts_and_the_page_matches_sacct(slurm, processes, client):
    cluster = ClusterFactory(name="int-jobs", slug="int-jobs", billing_rate_per_gpu_hour=RATE)
    Cluster.objects.filter(pk=cluster.pk).update(scheduler="slurm",
                                                 scheduler_config=str(slurm.slurm_conf))
    slurm.add_user("jobsalice", "research")
    slurm.add_user("jobsbob", "vision")
    # Jobs of earlier tests have ended by now; the period starts after them.
    since = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(seconds=1)
    time.sleep(1.5)

    finished = [
        slurm.sbatch("sleep 2", user="jobsalice", account="research", gres="gpu:2",
                     nodelist="gpu-001", name="train"),
        slurm.sbatch("sleep 1", user="jobsbob", account="vision", gres="gpu:3",
                     nodelist="gpu-002", name="eval"),
        slurm.sbatch("sleep 1; exit 3", user="jobsbob", account="vision", gres="gpu:1",
                     nodelist="gpu-003,gpu-004", name="two-nodes", extra=["-N2"]),
    ]
    running = slurm.sbatch("sleep 30", user="jobsbob", account="vision", gres="gpu:4",
                           nodelist="gpu-003", name="long")
    slurm.run(["srun", "--account=research", "--gres=gpu:1", "-w", "gpu-004", "sleep", "1"],
              user="jobsalice")
    wait_until(lambda: all_finished(slurm, since, finished), timeout=30,
               what="sacct reports the short jobs finished", interval=0.5)

    # 1. A new process imports while the long job runs.
    first = import_in_a_new_process(processes.env, cluster.slug)
    assert first.returncode == 0, first.stderr
    jobs = stored_jobs(cluster)
    assert set(finished) | {running} <= set(jobs)
    assert jobs[running].state == "RUNNING" and jobs[running].end is None
    assert jobs[finished[2]].exit_code == "3:0" and jobs[finished[2]].gpus == 2
    assert set(JobNode.objects.filter(job=jobs[finished[2]]).values_list(
        "node_name", flat=True)) == {"gpu-003", "gpu-004"}
    cursor = ImportCursor.objects.get(cluster=cluster)
    imported_until = cursor.imported_until

    # 2. slurmdbd goes away: the import fails, says so, and the cursor stays.
    slurm.daemons["slurmdbd"].stop()
    # A job that starts and ends while slurmdbd is down reaches accounting later.
    during_outage = slurm.sbatch("sleep 1", user="jobsalice", account="research",
                                 gres="gpu:1", nodelist="gpu-002", name="during-outage")
    failed = import_in_a_new_process(processes.env, cluster.slug)
    assert failed.returncode != 0
    cursor.refresh_from_db()
    assert cursor.imported_until == imported_until and cursor.last_error
    client.force_login(UserFactory(username="vera", role=Role.VIEWER))
    html = client.get(reverse("jobs:list", args=[cluster.slug])).content.decode()
    assert 'id="import-error"' in html

    # 3. slurmdbd back; once everything has ended, another new process imports.
    slurm.restart_daemon("slurmdbd")
    wait_until(lambda: all_finished(slurm, since, [*finished, running, during_outage]),
               timeout=60, what="sacct reports every job finished", interval=0.5)
    again = import_in_a_new_process(processes.env, cluster.slug)
    assert again.returncode == 0, again.stderr
    cursor.refresh_from_db()
    assert cursor.last_error == "" and cursor.imported_until > imported_until

    # Nothing lost, nothing duplicated, every field as sacct has it now.
    fields = ("JobID", "User", "Account", "NodeList", "AllocTRES", "State", "ExitCode",
              "Elapsed")
    reported = {row[0]: row for row in sacct(slurm, since, *fields)}
    assert len(reported) >= 6
    jobs = stored_jobs(cluster)
    assert set(reported) <= set(jobs)
    assert Job.objects.filter(cluster=cluster).count() == len(jobs)
    for job_id, (_, user, account, nodes, tres, state, exit_code, elapsed) in reported.items():
        job = jobs[job_id]
        assert (job.user, job.account, job.node_list, job.gpus, job.state, job.exit_code,
                job.elapsed_s) == (user, account, nodes, gpus(tres), state, exit_code,
                                   elapsed_seconds(elapsed)), job_id
        assert job.end is not None
    assert jobs[running].state == "COMPLETED"

    # Importing once more (in this process) changes nothing.
    before = sorted(Job.objects.filter(cluster=cluster).values_list())
    result = do_import_jobs(cluster, slurm_conf=str(slurm.slurm_conf))
    assert (result.created, result.updated, result.error) == (0, 0, "")
    assert sorted(Job.objects.filter(cluster=cluster).values_list()) == before

    # The page's GPU-hours and cost per user and account are sacct's.
    expected = expected_usage(slurm, since)
    assert set(expected["user"]) == {"jobsalice", "jobsbob"}
    response = client.get(reverse("jobs:list", args=[cluster.slug]),
                          {"start": since.strftime(UTC_FORMAT),
                           "end": datetime.now(timezone.utc).strftime(UTC_FORMAT)})
    html = response.content.decode()
    assert page_usage(html, "usage-by-user") == {
        name: as_page(seconds) for name, seconds in expected["user"].items()}
    assert page_usage(html, "usage-by-account") == {
        name: as_page(seconds) for name, seconds in expected["account"].items()}
