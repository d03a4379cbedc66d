"""The audit trail page (/audit/) and its CSV export: admins search who changed what."""

import csv
import io
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from clusters.services import record_audit
from clusters.tests.factories import ClusterFactory
from nodes.tests.factories import NodeFactory
from repairs.tests.factories import RepairFactory

pytestmark = pytest.mark.django_db

AUDIT = reverse("clusterui:audit")
AUDIT_CSV = reverse("clusterui:audit_csv")


@pytest.fixture(autouse=True)
def quick_password_hashing(settings):
    """The personas' passwords are never used (the client signs in with force_login); the
    default hasher takes most of a second for each."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def trail(cluster, admin, operator):
    """Five changes over three days, by two people, on two clusters."""
    now = timezone.now()
    other = ClusterFactory(name="staging-a100", slug="staging-a100")
    node = NodeFactory(cluster=cluster, name="gpu-0042")
    repair = RepairFactory(node=node)
    record_audit(admin, "cluster.update", cluster, cluster=cluster, now=now - timedelta(days=3),
                 changes={"region": {"before": "us-west-2", "after": "eu-north-1"}})
    record_audit(operator, "node.pause", node, cluster=cluster, now=now - timedelta(days=2),
                 changes={"reason": "disk swap"})
    record_audit(operator, "repair.approve", repair, cluster=cluster,
                 now=now - timedelta(hours=5), changes={"comment": "go"})
    record_audit(admin, "repairsettings.update", other, cluster=other,
                 now=now - timedelta(minutes=30))
    record_audit(None, "repair.propose", repair, cluster=cluster, now=now - timedelta(minutes=1))
    return {"node": node, "repair": repair}


def actions_listed(response):
    return [entry.action for entry, _ in response.context["rows"]]


def test_admins_see_every_change_newest_first(client_for, admin, trail):
    response = client_for(admin).get(AUDIT)
    assert response.status_code == 200
    assert actions_listed(response) == ["repair.propose", "repairsettings.update",
                                        "repair.approve", "node.pause", "cluster.update"]
    assert "region: us-west-2 → eu-north-1" in response.text
    assert "alice" in response.text and "system" in response.text


@pytest.mark.parametrize("query, expected", [
    ({"person": "ALI"}, ["repair.approve", "node.pause"]),
    ({"action": "repair."}, ["repair.propose", "repair.approve"]),
    ({"action": "repairsettings"}, ["repairsettings.update"]),
    ({"object": "gpu-0042"}, ["repair.propose", "repair.approve", "node.pause"]),
    ({"object": "repairs.repair"}, ["repair.propose", "repair.approve"]),
    ({"cluster": "staging-a100"}, ["repairsettings.update"]),
    ({"period": "24h"}, ["repair.propose", "repairsettings.update", "repair.approve"]),
    ({"person": "alice", "period": "24h"}, ["repair.approve"]),
])
def test_it_filters_by_person_action_object_cluster_and_time(client_for, admin, trail, query,
                                                             expected):
    assert actions_listed(client_for(admin).get(AUDIT, query)) == expected


def test_it_filters_by_the_objects_id(client_for, admin, cluster, trail):
    node = NodeFactory(cluster=cluster, pk=987654)
    record_audit(admin, "node.resume", node, cluster=cluster)
    assert actions_listed(client_for(admin).get(AUDIT, {"object": "987654"})) == ["node.resume"]


def test_it_filters_by_a_time_window(client_for, admin, trail):
    now = timezone.localtime()
    query = {"since": (now - timedelta(days=2, hours=1)).strftime("%Y-%m-%dT%H:%M"),
             "until": (now - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")}
    assert actions_listed(client_for(admin).get(AUDIT, query)) == ["repair.approve", "node.pause"]


def test_a_window_that_ends_before_it_starts_shows_why_and_nothing(client_for, admin, trail):
    response = client_for(admin).get(AUDIT, {"since": "2025-06-02T00:00",
                                             "until": "2025-06-01T00:00"})
    assert "must not be before since" in response.text
    assert actions_listed(response) == []


def test_it_pages_fifty_at_a_time(client_for, admin, cluster):
    start = timezone.now() - timedelta(hours=1)
    for minute in range(51):
        record_audit(admin, f"cluster.update.{minute}", cluster,
                     now=start + timedelta(minutes=minute))
    first = client_for(admin).get(AUDIT)
    assert len(first.context["rows"]) == 50 and "page 1 of 2 (51 in all)" in first.text
    assert actions_listed(client_for(admin).get(AUDIT, {"page": 2})) == ["cluster.update.0"]


def test_its_query_count_does_not_grow_with_entries(client_for, admin, operator, cluster):
    client = client_for(admin)

    def queries_for_a_page():
        with CaptureQueriesContext(connection) as queries:
            assert client.get(AUDIT).status_code == 200
        return len(queries)

    node = NodeFactory(cluster=cluster)
    record_audit(operator, "node.pause", node, cluster=cluster)
    with_one = queries_for_a_page()
    for n in range(40):
        other = ClusterFactory()
        record_audit(admin if n % 2 else operator, "node.pause", NodeFactory(cluster=other),
                     cluster=other)
    assert queries_for_a_page() == with_one


def test_an_htmx_request_gets_the_table_alone(client_for, admin, trail):
    response = client_for(admin).get(AUDIT, {"action": "node."}, HTTP_HX_REQUEST="true")
    assert response.text.lstrip().startswith('<div id="audit-table">')
    assert "<html" not in response.text and "node.pause" in response.text


def test_the_csv_holds_every_filtered_entry(client_for, admin, trail):
    response = client_for(admin).get(AUDIT_CSV, {"person": "alice"})
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"] == 'attachment; filename="audit.csv"'
    rows = list(csv.reader(io.StringIO(response.text)))
    assert rows[0] == ["time", "person", "action", "object_type", "object_id", "object",
                       "cluster", "source_ip", "changes"]
    assert [(r[1], r[2], r[3], r[6]) for r in rows[1:]] == [
        ("alice", "repair.approve", "repairs.repair", "prod-h200"),
        ("alice", "node.pause", "nodes.node", "prod-h200"),
    ]
    assert rows[1][8] == '{"comment": "go"}'


def test_the_csv_is_not_paged(client_for, admin, cluster):
    for n in range(120):
        record_audit(admin, "cluster.update", cluster)
    response = client_for(admin).get(AUDIT_CSV)
    assert len(list(csv.reader(io.StringIO(response.text)))) == 121


def test_the_csv_defuses_spreadsheet_formulas(client_for, admin, cluster):
    """Agents name their nodes: a name a spreadsheet would run must arrive as text."""
    node = NodeFactory(cluster=cluster, name='=HYPERLINK("http://evil.example")')
    record_audit(None, "node.register", node, cluster=cluster)
    rows = list(csv.reader(io.StringIO(client_for(admin).get(AUDIT_CSV).text)))
    assert rows[1][5] == '\'=HYPERLINK("http://evil.example")'


def test_the_csv_refuses_invalid_filters(client_for, admin):
    response = client_for(admin).get(AUDIT_CSV, {"since": "yesterday-ish"})
    assert response.status_code == 400 and "since" in response.text


def test_the_csv_records_a_source_ip(client_for, admin, cluster):
    record_audit(admin, "cluster.update", cluster, request=type(
        "Request", (), {"META": {"REMOTE_ADDR": "10.1.2.3"}})())
    rows = list(csv.reader(io.StringIO(client_for(admin).get(AUDIT_CSV).text)))
    assert rows[1][7] == "10.1.2.3"


def test_only_admins_see_it(client_for, operator, trail):
    client = client_for(operator)
    assert client.get(AUDIT).status_code == 403
    assert client.get(AUDIT_CSV).status_code == 403


def test_the_top_navigation_links_it_for_admins_only(client_for, admin, operator, cluster):
    overview = reverse("clusterui:overview", args=[cluster.slug])
    assert f'href="{AUDIT}"' in client_for(admin).get(overview).text
    assert f'href="{AUDIT}"' not in client_for(operator).get(overview).text


def test_nothing_on_the_page_changes_an_entry(client_for, admin, trail):
    client = client_for(admin)
    assert client.post(AUDIT).status_code == 405
    assert client.post(AUDIT_CSV).status_code == 405
    assert 'method="post"' not in client.get(AUDIT).text.split("<main>", 1)[1]
