import csv
import io
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
from django.urls import reverse

from clusters.tests.factories import ClusterFactory
from healthchecks.models import HealthEvent
from jobs.models import ImportCursor
from jobs.tests.factories import JobFactory
from nodes.tests.factories import NodeFactory

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
PERIOD = {"start": "2026-11-01T00:00:00", "end": "2026-11-02T00:00:00"}


@pytest.fixture
def url(cluster):
    return reverse("jobs:list", args=[cluster.slug])


@pytest.fixture
def jobs(cluster):
    """Alice (research) 2 GPUs for 3 h, half of it before the period; Bob (vision) 4 GPUs
    for 1 h in the period and 1 GPU for 1 h after it; a CPU job."""
    cluster.billing_rate_per_gpu_hour = Decimal("2.5000")
    cluster.save()
    return [
        JobFactory(cluster=cluster, job_id="1", user="alice", account="research", gpus=2,
                   start=T0 - timedelta(hours=1, minutes=30),
                   end=T0 + timedelta(hours=1, minutes=30), state="COMPLETED"),
        JobFactory(cluster=cluster, job_id="2", user="bob", account="vision", gpus=4,
                   start=T0 + timedelta(hours=5), end=T0 + timedelta(hours=6),
                   state="FAILED", node_list="gpu-002"),
        JobFactory(cluster=cluster, job_id="3", user="bob", account="vision", gpus=1,
                   start=T0 + timedelta(days=2), end=T0 + timedelta(days=2, hours=1),
                   state="COMPLETED"),
        JobFactory(cluster=cluster, job_id="4", user="carol", account="research", gpus=0,
                   start=T0 + timedelta(hours=1), end=T0 + timedelta(hours=2),
                   state="COMPLETED"),
    ]


def usage_rows(html, table_id):
    """{name: (gpu_hours, cost)} from one of the page's usage tables."""
    import re
    table = html.split(f'id="{table_id}"')[1].split("</table>")[0]
    return {m[0]: (m[1], m[2]) for m in re.findall(
        r'<tr data-\w+="([^"]*)">.*?data-gpu-hours>([^<]*)<.*?data-cost>([^<]*)<', table)}


def test_gpu_hours_and_cost_count_the_part_of_each_job_inside_the_period(
        client_for, viewer, url, jobs):
    response = client_for(viewer).get(url, PERIOD)
    html = response.content.decode()
    assert usage_rows(html, "usage-by-user") == {"alice": ("3.00", "7.50"),
                                                 "bob": ("4.00", "10.00")}
    assert usage_rows(html, "usage-by-account") == {"vision": ("4.00", "10.00"),
                                                    "research": ("3.00", "7.50")}
    assert 'data-chart=' in html and 'aria-current="page">Jobs<' in html
    listed = [j.job_id for j in response.context["page"]]
    assert listed == ["2", "4", "1"]


def test_a_running_job_counts_until_now(client_for, viewer, url, cluster):
    JobFactory(cluster=cluster, user="alice", gpus=2,
               start=datetime.now(timezone.utc) - timedelta(hours=1), end=None)
    html = client_for(viewer).get(url).content.decode()
    hours, _ = usage_rows(html, "usage-by-user")["alice"]
    assert Decimal("1.99") <= Decimal(hours) <= Decimal("2.01")


@pytest.mark.parametrize("query, expected", [
    ({"user": "bob"}, ["2"]),
    ({"account": "research"}, ["4", "1"]),
    ({"state": "FAILED"}, ["2"]),
    ({"node": "gpu-002"}, ["2"]),
    ({"start": "2026-11-01T04:00:00", "end": "2026-11-03T12:00:00"}, ["3", "2"]),
])
def test_it_filters(client_for, viewer, url, jobs, query, expected):
    response = client_for(viewer).get(url, {**PERIOD, **query})
    assert [j.job_id for j in response.context["page"]] == expected


def test_the_filters_narrow_the_usage_too(client_for, viewer, url, jobs):
    html = client_for(viewer).get(url, {**PERIOD, "user": "bob"}).content.decode()
    assert usage_rows(html, "usage-by-user") == {"bob": ("4.00", "10.00")}


def test_htmx_gets_only_the_results(client_for, viewer, url, jobs):
    response = client_for(viewer).get(url, PERIOD, HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="results">')
    assert "<header" not in html


def test_the_csv_has_the_filtered_jobs_with_their_share_of_the_period(
        client_for, viewer, cluster, jobs):
    response = client_for(viewer).get(reverse("jobs:csv", args=[cluster.slug]),
                                      {**PERIOD, "account": "research"})
    assert response["Content-Disposition"] == 'attachment; filename="prod-h200-jobs.csv"'
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [r["job_id"] for r in rows] == ["1", "4"]
    assert (rows[0]["gpu_hours_in_period"], rows[0]["cost_in_period"]) == ("3.0000", "7.50")
    assert rows[0]["start"] == "2026-10-31T22:30:00+00:00"


def test_a_job_name_a_spreadsheet_would_run_is_written_as_text(client_for, viewer, cluster):
    """Job names and users come from Slurm, which takes them from anybody who submits."""
    JobFactory(cluster=cluster, job_id="9", user="mallory", name="=cmd|' /C calc'!A0",
               account="@sum", gpus=1, start=T0 + timedelta(hours=1),
               end=T0 + timedelta(hours=2), state="COMPLETED")
    response = client_for(viewer).get(reverse("jobs:csv", args=[cluster.slug]), PERIOD)
    row = next(csv.DictReader(io.StringIO(response.content.decode())))
    assert (row["name"], row["account"]) == ("'=cmd|' /C calc'!A0", "'@sum")
    assert row["gpus"] == "1"


def test_invalid_csv_filters_are_a_400(client_for, viewer, cluster):
    response = client_for(viewer).get(reverse("jobs:csv", args=[cluster.slug]),
                                      {"start": "yesterday"})
    assert response.status_code == 400


def test_a_failed_import_shows_on_the_page(client_for, viewer, url, cluster):
    ImportCursor.objects.create(cluster=cluster, last_error="sacct exited with status 1: boom",
                                last_attempt_at=T0)
    html = client_for(viewer).get(url).content.decode()
    assert 'id="import-error"' in html and "boom" in html


def test_lines_the_import_could_not_read_show_on_the_page(client_for, viewer, url, cluster):
    ImportCursor.objects.create(cluster=cluster, last_success_at=T0, last_warning_count=2,
                                last_warnings=["line 4: 3 fields, not 12: 17|x|y",
                                               "line 9: <b>odd</b>"])
    html = client_for(viewer).get(url).content.decode()
    assert 'id="import-warnings"' in html and "could not read 2 lines" in html
    assert "line 4: 3 fields, not 12: 17|x|y" in html and "&lt;b&gt;odd&lt;/b&gt;" in html


def test_the_page_takes_the_same_queries_for_more_jobs(
        client_for, viewer, url, cluster, django_assert_max_num_queries):
    client = client_for(viewer)
    JobFactory.create_batch(3, cluster=cluster, start=T0 + timedelta(hours=1))
    client.get(url, PERIOD)
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    with CaptureQueriesContext(connection) as few:
        client.get(url, PERIOD)
    JobFactory.create_batch(30, cluster=cluster, start=T0 + timedelta(hours=1))
    with CaptureQueriesContext(connection) as many:
        client.get(url, PERIOD)
    assert len(many) == len(few)


def test_another_clusters_jobs_are_not_counted(client_for, viewer, url, jobs):
    JobFactory(cluster=ClusterFactory(), user="alice", gpus=8, start=T0, end=T0 + timedelta(hours=1))
    html = client_for(viewer).get(url, PERIOD).content.decode()
    assert usage_rows(html, "usage-by-user")["alice"] == ("3.00", "7.50")


def test_the_node_page_lists_the_jobs_that_ran_on_it(client_for, viewer, cluster, jobs):
    node = NodeFactory(cluster=cluster, name="gpu-002")
    html = client_for(viewer).get(reverse("nodes:detail", args=[cluster.slug, node.name])).content.decode()
    panel = html.split('id="node-jobs"')[1].split("</section>")[0]
    assert 'data-job="2"' in panel and 'data-job="1"' not in panel


def test_a_health_event_links_to_the_jobs_on_its_node_at_that_time(client_for, viewer, cluster, jobs):
    node = NodeFactory(cluster=cluster, name="gpu-002")
    HealthEvent.objects.create(
        node=node, signature="xid:79", severity="critical",
        first_seen=T0 + timedelta(hours=5, minutes=10), last_seen=T0 + timedelta(hours=5, minutes=20),
        closed_at=T0 + timedelta(hours=5, minutes=30))
    html = client_for(viewer).get(reverse("healthchecks:list", args=[cluster.slug])
                                  + "?open=any").content.decode()  # a closed event
    import html as htmllib
    import re
    link = htmllib.unescape(re.search(r'href="([^"]*)"[^>]*>jobs at that time<', html)[1])
    response = client_for(viewer).get(link)
    assert [j.job_id for j in response.context["page"]] == ["2"]
    # The form shows the period it lists, in the fields' own format.
    assert 'name="start" value="2026-11-01T05:10:00"' in response.text
    assert response.context["filters"].errors == {}


def test_a_notice_closed_within_its_second_links_to_a_valid_period(client_for, viewer,
                                                                   cluster, jobs):
    node = NodeFactory(cluster=cluster, name="gpu-002")
    at = T0 + timedelta(hours=5, minutes=10, microseconds=250_000)
    HealthEvent.objects.create(node=node, signature="job_cleanup", severity="info",
                               first_seen=at, last_seen=at, closed_at=at)
    html = client_for(viewer).get(reverse("healthchecks:list", args=[cluster.slug])
                                  + "?open=any").content.decode()
    import html as htmllib
    import re
    link = htmllib.unescape(re.search(r'href="([^"]*)"[^>]*>jobs at that time<', html)[1])
    response = client_for(viewer).get(link)
    assert response.context["filters"].errors == {}
    assert 'name="end" value="2026-11-01T05:10:01"' in response.text
