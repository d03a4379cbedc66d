from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from healthchecks.models import HealthEvent
from healthchecks.services import do_record_health_event
from healthchecks.queries import open_events_by_signature
from nodes.tests.factories import GpuFactory, NodeFactory

pytestmark = pytest.mark.django_db


def event(node, signature, severity="critical", closed=False, *, gpu=None, source="passive",
          first_seen=None, last_seen=None, acknowledged_by=None):
    now = timezone.now()
    return HealthEvent.objects.create(
        node=node, gpu=gpu, signature=signature, severity=severity, source=source,
        first_seen=first_seen or last_seen or now, last_seen=last_seen or now,
        closed_at=now if closed else None, acknowledged_by=acknowledged_by,
        acknowledged_at=now if acknowledged_by else None)


@pytest.fixture
def url(cluster):
    return reverse("healthchecks:list", args=[cluster.slug])


def signatures(client, url, query=""):
    response = client.get(url + query)
    assert response.status_code == 200
    return sorted(e.signature for e in response.context["page"])


def test_the_tab_lists_the_clusters_events_with_filters(client_for, viewer, cluster, url):
    node = NodeFactory(cluster=cluster, name="gpu-017")
    event(node, "xid:79")
    event(node, "thermal_throttle", "warning", closed=True)
    event(node, "gpu_compute", "warning", source="active")
    event(NodeFactory(), "xid:48")  # another cluster
    client = client_for(viewer)

    assert signatures(client, url) == ["gpu_compute", "xid:79"]  # open ones, by default
    assert signatures(client, url, "?open=any") == ["gpu_compute", "thermal_throttle", "xid:79"]
    assert signatures(client, url, "?open=any&severity=warning") == ["gpu_compute",
                                                                      "thermal_throttle"]
    assert signatures(client, url, "?open=true") == ["gpu_compute", "xid:79"]
    assert signatures(client, url, "?open=false") == ["thermal_throttle"]
    assert signatures(client, url, "?source=active") == ["gpu_compute"]
    assert signatures(client, url, "?open=any&node=gpu-0") == ["gpu_compute",
                                                               "thermal_throttle", "xid:79"]
    assert signatures(client, url, "?node=gpu-018") == []


def test_the_tab_opens_on_open_events_worst_first(client_for, viewer, cluster, url):
    node = NodeFactory(cluster=cluster, name="gpu-017")
    now = timezone.now()
    event(node, "job_cleanup", "info", last_seen=now)
    event(node, "thermal_throttle", "warning", last_seen=now - timedelta(minutes=5))
    event(node, "xid:79", last_seen=now - timedelta(minutes=20))
    event(node, "xid:48", closed=True, last_seen=now)
    event(node, "hw_slowdown", "warning", last_seen=now - timedelta(minutes=1))
    response = client_for(viewer).get(url)
    assert [e.signature for e in response.context["page"]] == [
        "xid:79", "hw_slowdown", "thermal_throttle", "job_cleanup"]
    assert '<option value="true" selected>open</option>' in response.content.decode()
    assert '<td class="nowrap"><a href="' in response.content.decode()  # names never wrap


def test_the_signature_filter_matches_whole_parts_of_a_signature(client_for, viewer, cluster,
                                                                 url):
    node = NodeFactory(cluster=cluster)
    for signature in ("xid:4", "xid:43", "xid:79", "thermal_throttle"):
        event(node, signature)
    client = client_for(viewer)

    assert signatures(client, url, "?signature=xid:4") == ["xid:4"]
    assert signatures(client, url, "?signature=XID") == ["xid:4", "xid:43", "xid:79"]
    assert signatures(client, url, "?signature=throttle") == ["thermal_throttle"]
    assert signatures(client, url, "?signature=xid:7") == []


def test_the_time_range_keeps_events_active_in_the_window(client_for, viewer, cluster, url):
    now = timezone.now()
    node = NodeFactory(cluster=cluster)
    event(node, "now", last_seen=now)
    event(node, "two-hours-ago", last_seen=now - timedelta(hours=2))
    # Opened three days ago and still repeating: active in every window.
    event(node, "long-running", first_seen=now - timedelta(days=3), last_seen=now)
    event(node, "last-week", first_seen=now - timedelta(days=8), last_seen=now - timedelta(days=6))
    event(node, "months-ago", last_seen=now - timedelta(days=90))
    client = client_for(viewer)

    assert signatures(client, url, "?period=1h") == ["long-running", "now"]
    assert signatures(client, url, "?period=24h") == ["long-running", "now", "two-hours-ago"]
    assert signatures(client, url, "?period=7d") == ["last-week", "long-running", "now",
                                                      "two-hours-ago"]
    assert len(signatures(client, url, "?period=")) == 5  # all time

    def at(delta):
        return (now + delta).strftime("%Y-%m-%dT%H:%M")  # what <input type=datetime-local> sends

    # Seven to five days ago: last week's event, and the one running since three days ago
    # is not in it (it started after the window ended).
    window = f"?since={at(-timedelta(days=7))}&until={at(-timedelta(days=5))}"
    assert signatures(client, url, window) == ["last-week"]
    assert signatures(client, url, f"?until={at(-timedelta(days=60))}") == ["months-ago"]
    # A preset and since/until together: every bound applies.
    assert signatures(client, url, f"?period=24h&until={at(-timedelta(hours=1))}") == [
        "long-running", "two-hours-ago"]


def test_a_window_that_ends_before_it_starts_is_refused(client_for, viewer, cluster, url):
    event(NodeFactory(cluster=cluster), "xid:79")
    response = client_for(viewer).get(url + "?since=2026-01-02T00:00&until=2026-01-01T00:00")
    assert list(response.context["page"]) == []
    assert "must not be before since" in response.text


def test_the_counts_by_signature_show_open_events_nodes_and_worst_severity(client_for, viewer,
                                                                           cluster, url):
    a, b, c = (NodeFactory(cluster=cluster) for _ in range(3))
    for node in (a, b):
        for index in (1, 2):
            event(node, "xid:79", gpu=GpuFactory(node=node, index=index))
    event(a, "thermal_throttle", "warning")
    event(b, "thermal_throttle", "critical")
    event(c, "xid:31", "info")
    event(c, "xid:13", closed=True)  # closed: not counted
    event(NodeFactory(), "xid:48")  # another cluster

    counts = open_events_by_signature(cluster)

    assert [(r["signature"], r["events"], r["nodes"], r["severity"]) for r in counts] == [
        ("xid:79", 4, 2, "critical"),
        ("thermal_throttle", 2, 2, "critical"),
        ("xid:31", 1, 1, "info"),
    ]
    text = client_for(viewer).get(url).text
    # Each count links to the open events of its signature.
    assert f'href="{url}?signature=xid%3A79&amp;open=true"' in text
    assert signatures(client_for(viewer), url, "?signature=xid%3A79&open=true") == ["xid:79"] * 4


def test_the_counts_are_one_query(cluster, django_assert_num_queries):
    node = NodeFactory(cluster=cluster)
    for signature in ("xid:79", "xid:48", "thermal_throttle"):
        event(node, signature)
    with django_assert_num_queries(1):
        assert len(open_events_by_signature(cluster)) == 3


def test_without_open_events_the_counts_say_so(client_for, viewer, cluster, url):
    event(NodeFactory(cluster=cluster), "xid:79", closed=True)
    assert "No open health events." in client_for(viewer).get(url).text

# Session, user, role, cluster, the count and the rows of the page, their repairs (one
# prefetch), the counts by signature; the whole page also lists the clusters (the switcher).
FRAGMENT_QUERIES = 8
PAGE_QUERIES = FRAGMENT_QUERIES + 1


@pytest.mark.parametrize("events_per_node", [1, 8])
def test_the_tabs_queries_do_not_grow_with_its_events(client_for, operator, cluster, url,
                                                      events_per_node,
                                                      django_assert_num_queries):
    for n in range(4):
        node = NodeFactory(cluster=cluster)
        for index in range(events_per_node):
            event(node, f"xid:{index}", gpu=GpuFactory(node=node, index=index),
                  acknowledged_by=operator if index % 2 else None)
    client = client_for(operator)
    with django_assert_num_queries(PAGE_QUERIES):
        response = client.get(url)
    assert len(response.context["page"]) == 4 * events_per_node
    with django_assert_num_queries(FRAGMENT_QUERIES):
        client.get(url + "?period=24h", HTTP_HX_REQUEST="true")


def test_an_htmx_request_gets_the_table_and_the_counts_out_of_band(client_for, viewer, cluster,
                                                                   url):
    event(NodeFactory(cluster=cluster), "xid:79")
    response = client_for(viewer).get(url, HTTP_HX_REQUEST="true")
    text = response.text.strip()
    assert text.startswith('<div id="event-table">')
    assert '<div id="signature-counts" hx-swap-oob="true">' in text
    assert "<html" not in text and 'class="filters"' not in text
    assert response["Vary"] and "HX-Request" in response["Vary"]

    page = client_for(viewer).get(url).text
    assert '<div id="signature-counts">' in page  # in place on first paint
    assert 'name="period"' in page and 'name="since"' in page and 'name="until"' in page
    assert "js/health." in page  # js/health.<hash>.js with the manifest storage



def test_an_events_row_links_to_its_repair(client_for, viewer, cluster):
    from repairs.tests.factories import RepairFactory

    node = NodeFactory(cluster=cluster, name="gpu-004")
    event = do_record_health_event(node, signature="gpu_lost", severity="critical",
                                   message="GPU 2 is lost")
    repair = RepairFactory(node=node, signature="gpu_lost")
    repair.events.add(event)
    page = client_for(viewer).get(reverse("healthchecks:list", args=[cluster.slug])).text
    assert f'href="/c/{cluster.slug}/repair/{repair.public_id}/">repair #{repair.pk}: reboot</a>' in page
