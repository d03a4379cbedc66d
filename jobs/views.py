import json
from datetime import timedelta

from django.core.paginator import Paginator
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from clusters.queries import get_cluster_for_user
from clusters.roles import Role, require_role
from common.exports import csv_response, invalid_filters_response

from .accounting import cost, gpu_seconds_in_period, overlapping, usage_by_user_and_account
from .forms import JobFilterForm
from .models import ImportCursor, Job

DEFAULT_PERIOD = timedelta(days=7)
PAGE_SIZE = 50


def filtered_jobs(cluster, request):
    """(form, jobs in the period matching the filters, period_start, period_end, now)."""
    form = JobFilterForm(request.GET)
    form.is_valid()
    query = form.cleaned_data
    now = timezone.now()
    period_end = query.get("end") or now
    period_start = query.get("start") or period_end - DEFAULT_PERIOD
    jobs = Job.objects.filter(cluster=cluster)
    for field in ("user", "account"):
        if query.get(field):
            jobs = jobs.filter(**{field: query[field]})
    if query.get("state"):
        jobs = jobs.filter(state__startswith=query["state"])
    if query.get("node"):
        jobs = jobs.filter(job_nodes__node_name=query["node"])
    return form, overlapping(jobs, period_start, period_end), period_start, period_end, now


@require_GET
@require_role(Role.VIEWER)
def job_list(request, slug):
    cluster = get_cluster_for_user(request, slug)
    form, jobs, period_start, period_end, now = filtered_jobs(cluster, request)
    users, accounts = usage_by_user_and_account(jobs, period_start, period_end, now)
    rate = cluster.billing_rate_per_gpu_hour
    context = {
        "cluster": cluster,
        "tab": "jobs",
        "filters": form,
        "period_start": period_start,
        "period_end": period_end,
        "page": Paginator(jobs.order_by("-start", "-id"), PAGE_SIZE).get_page(
            form.cleaned_data.get("page") or 1),
        "by_user": [(u, cost(u.gpu_seconds, rate)) for u in users],
        "by_account": [(a, cost(a.gpu_seconds, rate)) for a in accounts],
        "chart_json": json.dumps({
            "users": [u.name for u in users],
            "user_gpu_hours": [float(u.gpu_hours) for u in users],
            "accounts": [a.name for a in accounts],
            "account_gpu_hours": [float(a.gpu_hours) for a in accounts]}),
        "import_status": ImportCursor.objects.filter(cluster=cluster).first(),
    }
    return render(request, "jobs/list.html" + ("#results" if request.htmx else ""), context)


CSV_COLUMNS = ["job_id", "name", "user", "account", "partition", "nodes", "gpus", "start",
               "end", "state", "exit_code", "elapsed_s", "gpu_hours_in_period",
               "cost_in_period"]


@require_GET
@require_role(Role.VIEWER)
def job_csv(request, slug):
    """The page's jobs with its filters, every page, as CSV (times in UTC); GPU-hours and
    cost count the part of each job inside the period."""
    cluster = get_cluster_for_user(request, slug)
    form, jobs, period_start, period_end, now = filtered_jobs(cluster, request)
    if not form.is_valid():
        return invalid_filters_response(form.errors)
    rate = cluster.billing_rate_per_gpu_hour

    def row(job):
        seconds = gpu_seconds_in_period(job.gpus, job.start, job.end, period_start,
                                        period_end, now)
        return [job.job_id, job.name, job.user, job.account, job.partition, job.node_list,
                job.gpus, job.start.isoformat() if job.start else "",
                job.end.isoformat() if job.end else "", job.state, job.exit_code, job.elapsed_s,
                f"{seconds / 3600:.4f}", cost(seconds, rate)]

    return csv_response(f"{cluster.slug}-jobs.csv", CSV_COLUMNS,
                        (row(job) for job in jobs.order_by("start", "id").iterator(chunk_size=500)))
