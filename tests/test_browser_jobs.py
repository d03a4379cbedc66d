"""In Chromium: a viewer opens the Jobs tab, sees GPU-hours and cost per user and account with
their chart, narrows the jobs to one user without a reload, and downloads them as CSV."""

import csv
import io
from datetime import timedelta
from decimal import Decimal
from urllib.parse import urlsplit

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from clusters.roles import Role
from clusters.tests.factories import ClusterFactory, UserFactory
from jobs.tests.factories import JobFactory

from .browser import assert_no_csp_violations, screenshot, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.integration,
              pytest.mark.django_db(transaction=True)]


def test_a_viewer_reads_gpu_hours_filters_and_downloads_the_csv(page, console):
    cluster = ClusterFactory(name="jobs-h200", slug="jobs-h200",
                             billing_rate_per_gpu_hour=Decimal("3.0000"))
    UserFactory(username="vera", role=Role.VIEWER)
    ended = timezone.now().replace(microsecond=0) - timedelta(hours=1)
    JobFactory(cluster=cluster, job_id="101", user="alice", account="research", gpus=8,
               start=ended - timedelta(hours=2), end=ended, state="COMPLETED",
               node_list="gpu-001")
    JobFactory(cluster=cluster, job_id="102", user="bob", account="vision", gpus=2,
               start=ended - timedelta(hours=3), end=ended, state="FAILED",
               exit_code="1:0", node_list="gpu-002")
    jobs_tab = f"/c/{cluster.slug}/jobs/"

    page.goto(jobs_tab)
    sign_in(page, "vera", "password")
    assert urlsplit(page.url).path == jobs_tab
    expect(page.locator("nav.tabs a[aria-current=page]")).to_have_text("Jobs")
    alice = page.locator('#usage-by-user tr[data-user="alice"]')
    expect(alice.locator("[data-gpu-hours]")).to_have_text("16.00")
    expect(alice.locator("[data-cost]")).to_have_text("48.00")
    expect(page.locator('#usage-by-account tr[data-account="vision"] [data-gpu-hours]')
           ).to_have_text("6.00")
    # plotly drew the chart (static/js/jobs.js, under the page's CSP).
    expect(page.locator("#jobs-chart .main-svg").first).to_be_attached(timeout=15_000)
    expect(page.locator("table.jobs tbody tr")).to_have_count(2)
    # The chart outlives the live socket's summaries (static/js/live.js once wiped it).
    page.evaluate("document.body.addEventListener('cluster-summary', () => "
                  "{ document.body.dataset.summarySeen = 'yes'; })")
    expect(page.locator("body")).to_have_attribute("data-summary-seen", "yes", timeout=15_000)
    expect(page.locator("#jobs-chart .main-svg").first).to_be_attached()
    screenshot(page, "jobs")

    page.evaluate("window.jobsTestMarker = 'kept'")
    page.fill("#id_user", "bob")
    expect(page.locator("table.jobs tbody tr")).to_have_count(1)
    expect(page.locator('table.jobs tr[data-job="102"]')).to_be_visible()
    expect(page.locator("#usage-by-user tbody tr")).to_have_count(1)
    expect(page.locator("#jobs-chart .main-svg").first).to_be_attached(timeout=15_000)
    assert page.evaluate("window.jobsTestMarker") == "kept"  # no reload
    assert "user=bob" in page.url

    with page.expect_download() as download_info:
        page.click("#jobs-csv")
    download = download_info.value
    assert download.suggested_filename == "jobs-h200-jobs.csv"
    rows = list(csv.DictReader(io.StringIO(open(download.path(), encoding="utf-8").read())))
    assert [(r["job_id"], r["user"], r["gpus"], r["state"], r["exit_code"],
             r["gpu_hours_in_period"], r["cost_in_period"]) for r in rows] == [
        ("102", "bob", "2", "FAILED", "1:0", "6.0000", "18.00")]
    screenshot(page, "jobs-filtered")
    assert not console.errors, str(console)
    assert_no_csp_violations(console)
