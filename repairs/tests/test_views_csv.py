"""The history as CSV: every finished repair the tab's filters keep, across its pages, with
who requested and reviewed it and how it ended."""

import csv
import io
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from nodes.tests.factories import GpuFactory, NodeFactory
from repairs.choices import Action, Status
from repairs.tests.factories import RepairFactory
from repairs.views import CSV_COLUMNS

pytestmark = pytest.mark.django_db


@pytest.fixture
def url(cluster):
    return reverse("repairs:history_csv", args=[cluster.slug])


def rows(response):
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    return list(csv.DictReader(io.StringIO(response.content.decode())))


def finished(node, status, *, days_ago=1, **fields):
    at = timezone.now() - timedelta(days=days_ago)
    return RepairFactory(node=node, status=status, requested_at=at,
                         finished_at=at + timedelta(minutes=30), **fields)


def test_the_csv_has_every_column_and_who_did_what(client_for, viewer, operator, cluster, url):
    node = NodeFactory(cluster=cluster, name="gpu-017")
    gpu = GpuFactory(node=node, index=3)
    done = finished(node, Status.SUCCEEDED, gpu=gpu, reviewed_by=operator,
                    reviewed_at=timezone.now(), review_comment="go, ok",
                    started_at=timezone.now(), outcome="healthy again")
    finished(node, Status.REJECTED, days_ago=2, action=Action.REMOVE, requested_by=operator,
             signature="manual", reviewed_by=operator, reviewed_at=timezone.now(),
             outcome="rejected")
    RepairFactory(node=node)  # open: not in the history

    response = client_for(viewer).get(url)

    assert response["Content-Disposition"] == 'attachment; filename="prod-h200-repairs.csv"'
    found = rows(response)
    assert list(found[0]) == CSV_COLUMNS
    assert [r["status"] for r in found] == ["succeeded", "rejected"]  # newest finish first
    first = found[0]
    assert first["repair"] == str(done.pk) and first["id"] == str(done.public_id)
    assert (first["node"], first["gpu"], first["action"], first["signature"]) == (
        "gpu-017", "3", "reboot", "xid:79")
    assert (first["requested_by"], first["reviewed_by"], first["review_comment"]) == (
        "system", "alice", "go, ok")
    assert first["outcome"] == "healthy again" and first["auto_approved"] == "no"
    assert first["finished_at"] == done.finished_at.isoformat()
    assert (found[1]["requested_by"], found[1]["action"]) == ("alice", "remove")


def test_the_csv_keeps_the_tabs_filters(client_for, viewer, cluster, url):
    a = NodeFactory(cluster=cluster, name="gpu-001")
    b = NodeFactory(cluster=cluster, name="gpu-002")
    finished(a, Status.SUCCEEDED, days_ago=1)
    finished(b, Status.FAILED, action=Action.REPROVISION, days_ago=2)
    finished(b, Status.CANCELLED, days_ago=20)
    finished(NodeFactory(name="gpu-777"), Status.SUCCEEDED)  # another cluster
    client = client_for(viewer)

    def nodes(query=""):
        return [(r["node"], r["status"]) for r in rows(client.get(url + query))]

    assert nodes() == [("gpu-001", "succeeded"), ("gpu-002", "failed"),
                       ("gpu-002", "cancelled")]
    assert nodes("?node=gpu-002&status=failed") == [("gpu-002", "failed")]
    assert nodes("?action=reprovision") == [("gpu-002", "failed")]
    assert nodes("?period=7d") == [("gpu-001", "succeeded"), ("gpu-002", "failed")]


def test_more_than_a_page_is_all_in_the_csv(client_for, viewer, cluster, url):
    node = NodeFactory(cluster=cluster)
    for days_ago in range(60):
        finished(node, Status.SUCCEEDED, days_ago=days_ago + 1)
    assert len(rows(client_for(viewer).get(url))) == 60


def test_invalid_filters_are_a_400(client_for, viewer, url):
    response = client_for(viewer).get(url + "?status=proposed")
    assert response.status_code == 400 and "status" in response.text


def test_users_without_a_role_get_403(client_for, outsider, url):
    assert client_for(outsider).get(url).status_code == 403


def test_text_a_spreadsheet_would_run_is_written_as_text(client_for, viewer, operator,
                                                         cluster, url):
    """An operator's comment, like a node an agent named, is somebody's text: a leading
    =, +, - or @ gets an apostrophe (OWASP CSV injection)."""
    node = NodeFactory(cluster=cluster, name="gpu-017")
    finished(node, Status.REJECTED, reviewed_by=operator, reviewed_at=timezone.now(),
             review_comment='=HYPERLINK("http://example.invalid","x")', outcome="-1 node")

    first = rows(client_for(viewer).get(url))[0]

    assert first["review_comment"] == '\'=HYPERLINK("http://example.invalid","x")'
    assert first["outcome"] == "'-1 node"
    assert first["repair"].isdigit()  # numbers are left alone
