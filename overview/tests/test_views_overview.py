import functools
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from clusters.tests.factories import ClusterFactory
from nodes.choices import NodeState
from nodes.models import ClusterRollup, Node
from nodes.tests.factories import NodeFactory, NodeTransitionFactory
from overview import queries as read

pytestmark = pytest.mark.django_db


def overview_url(cluster, **query):
    url = reverse("clusterui:overview", args=[cluster.slug])
    return url + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")


def add_nodes(cluster, count, state=NodeState.HEALTHY, start=0):
    now = timezone.now()
    Node.objects.bulk_create(
        Node(cluster=cluster, name=f"n{start + i:05d}", state=state, joined_at=now)
        for i in range(count)
    )


def test_it_shows_the_five_counts(client_for, viewer, cluster):
    for state, n in [("healthy", 5), ("booting", 1), ("unhealthy", 3), ("paused", 2)]:
        NodeFactory.create_batch(n, cluster=cluster, state=state)
    NodeFactory(state=NodeState.UNHEALTHY)  # another cluster's node does not count

    response = client_for(viewer).get(overview_url(cluster))

    assert response.status_code == 200
    counts = {c["state"]: c["count"] for c in response.context["counts"]}
    assert counts == {"healthy": 5, "booting": 1, "unhealthy": 3, "pending": 0, "paused": 2}
    assert f'href="/c/{cluster.slug}/nodes/?state=unhealthy"' in response.text
    assert response.context["node_count"] == 11


def test_it_shows_the_configuration(client_for, viewer, cluster):
    response = client_for(viewer).get(overview_url(cluster))
    for text in ["us-west-2", "NVIDIA H200", "580.159.04", "InfiniBand NDR 400 Gb/s",
                 "Ubuntu 22.04", "$2.10 per GPU-hour"]:
        assert text in response.text


def test_usage_shows_the_latest_minute_and_the_last_hour(client_for, viewer, cluster,
                                                         monkeypatch):
    # The view's usage reads a fixed clock, half a minute past the latest rollup: a request
    # that lands in the next minute would leave the hour's first rollup out.
    now = timezone.now().replace(second=30, microsecond=0)
    monkeypatch.setattr(read, "usage", functools.partial(read.usage, now=now))
    minute = now.replace(second=0)
    ClusterRollup.objects.bulk_create(
        ClusterRollup(cluster=cluster, minute=minute - timedelta(minutes=m), gpus_reporting=512,
                      gpu_util_pct=70 + m / 10, gpu_mem_used_pct=64, net_bps=22.75e9)
        for m in range(90)
    )
    response = client_for(viewer).get(overview_url(cluster))

    usage = response.context["usage"]
    assert len(usage["series"]["minute"]) == 60  # the last hour
    assert usage["latest"]["gpu_util_pct"] == 70
    assert "182.0 Gb/s" in response.text
    assert "70 %" in response.text
    assert 'id="usage-series"' in response.text


@pytest.mark.parametrize("sm_active, shown, says_none", [
    (61.26, "61 %", False),
    (None, "–", True),  # no GPU reports it: before Hopper, NVML has no GPM
])
def test_sm_activity_shows_beside_utilization(client_for, viewer, cluster, sm_active, shown,
                                              says_none):
    ClusterRollup.objects.create(cluster=cluster, minute=timezone.now() - timedelta(minutes=1),
                                 gpus_reporting=8, gpu_util_pct=90, gpu_mem_used_pct=10,
                                 net_bps=0, gpu_sm_active_pct=sm_active)
    response = client_for(viewer).get(overview_url(cluster))
    figure = re.search(r'data-live-usage="gpu_sm_active_pct">([^<]*)</span>', response.text)
    assert figure.group(1) == shown
    hint = re.search(r'<small class="muted" id="sm-activity-none"( hidden)?', response.text)
    assert (hint.group(1) is None) == says_none
    assert response.context["usage"]["series"]["gpu_sm_active_pct"] == [
        None if sm_active is None else round(sm_active, 1)]


def test_without_fresh_telemetry_it_says_so(client_for, viewer, cluster):
    ClusterRollup.objects.create(cluster=cluster, minute=timezone.now() - timedelta(minutes=30),
                                 gpus_reporting=8, gpu_util_pct=50, gpu_mem_used_pct=10, net_bps=0)
    response = client_for(viewer).get(overview_url(cluster))
    assert response.context["usage"]["latest"] is None
    assert "No telemetry in the last 5 minutes" in response.text


def test_the_timeline_is_newest_first_paged_and_filterable(client_for, viewer, cluster):
    a = NodeFactory(cluster=cluster, name="gpu-017")
    b = NodeFactory(cluster=cluster, name="gpu-004")
    now = timezone.now()
    for i in range(30):
        NodeTransitionFactory(node=a, at=now - timedelta(minutes=i), to_state=NodeState.UNHEALTHY)
    NodeTransitionFactory(node=b, at=now - timedelta(hours=2), to_state=NodeState.BOOTING,
                          reason="repair #12")
    client = client_for(viewer)

    page1 = client.get(overview_url(cluster)).context["timeline"]
    assert page1.paginator.count == 31 and len(page1.object_list) == 25
    assert page1.object_list[0].at == now

    page2 = client.get(overview_url(cluster, page=2)).context["timeline"]
    assert page2.object_list[-1].node == b

    by_node = client.get(overview_url(cluster, node="gpu-004")).context["timeline"]
    assert [t.node for t in by_node] == [b]
    by_state = client.get(overview_url(cluster, state="booting")).context["timeline"]
    assert [t.reason for t in by_state] == ["repair #12"]


def test_an_htmx_request_gets_only_the_timeline(client_for, viewer, cluster):
    NodeTransitionFactory(node=NodeFactory(cluster=cluster))
    response = client_for(viewer).get(overview_url(cluster, page=1), HTTP_HX_REQUEST="true")
    assert response.text.lstrip().startswith('<div id="timeline"')
    assert "<html" not in response.text
    assert "HX-Request" in response["Vary"]


def test_a_bad_filter_value_is_ignored_not_an_error(client_for, viewer, cluster):
    response = client_for(viewer).get(overview_url(cluster, state="exploded", page="x"))
    assert response.status_code == 200


def test_a_missing_cluster_is_a_404_page(client_for, viewer):
    response = client_for(viewer).get("/c/no-such-cluster/")
    assert response.status_code == 404
    assert "Not found" in response.text


def test_it_needs_a_signed_in_user(client, cluster):
    response = client.get(overview_url(cluster))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_a_user_without_a_role_is_refused(client_for, outsider, cluster):
    response = client_for(outsider).get(overview_url(cluster))
    assert response.status_code == 403
    assert "Not allowed" in response.text


def test_home_goes_to_the_only_cluster_or_the_list(client_for, viewer, cluster):
    client = client_for(viewer)
    assert client.get("/")["Location"] == overview_url(cluster)
    ClusterFactory()
    assert client.get("/")["Location"] == reverse("clusterui:cluster_list")


def test_its_queries_do_not_grow_with_the_number_of_nodes(client_for, viewer, cluster):
    client = client_for(viewer)
    add_nodes(cluster, 9)
    add_nodes(cluster, 1, state=NodeState.UNHEALTHY, start=9)  # "Needs you" reads for it too
    NodeTransitionFactory(node=Node.objects.filter(cluster=cluster).first())
    client.get(overview_url(cluster))  # warm the session and the permission caches

    with CaptureQueriesContext(connection) as at_10:
        assert client.get(overview_url(cluster)).status_code == 200

    add_nodes(cluster, 1990, state=NodeState.UNHEALTHY, start=10)
    for node in Node.objects.filter(cluster=cluster)[:100]:
        NodeTransitionFactory(node=node)
    with CaptureQueriesContext(connection) as at_2000:
        response = client.get(overview_url(cluster))

    assert response.context["node_count"] == 2000
    assert len(at_2000) == len(at_10), [q["sql"] for q in at_2000]


def test_it_says_when_nodes_are_running_acceptance_tests(client_for, viewer, cluster):
    from healthchecks.services import do_request_check

    url = reverse("clusterui:overview", args=[cluster.slug])
    assert "Running acceptance tests" not in client_for(viewer).get(url).text
    for node in NodeFactory.create_batch(2, cluster=cluster, state=NodeState.PENDING):
        do_request_check(node, "gpu_compute", purpose="acceptance")
        do_request_check(node, "storage", purpose="acceptance")
    assert "Running acceptance tests on 2 nodes" in client_for(viewer).get(url).text


def test_it_says_how_many_repairs_await_approval(client_for, viewer, cluster):
    from repairs.tests.factories import RepairFactory

    url = reverse("clusterui:overview", args=[cluster.slug])
    assert "await" not in client_for(viewer).get(url).text
    for node in NodeFactory.create_batch(2, cluster=cluster):
        RepairFactory(node=node)
    assert "2 repairs await approval" in client_for(viewer).get(url).text


def test_it_says_when_the_cluster_is_degraded(client_for, viewer, cluster):
    add_nodes(cluster, 9)
    add_nodes(cluster, 1, state=NodeState.UNHEALTHY, start=9)
    calm = client_for(viewer).get(overview_url(cluster))  # 10 %: not over
    assert calm.context["degraded"] is None
    assert 'id="degraded" data-degraded-threshold="10" hidden>' in calm.text

    add_nodes(cluster, 1, state=NodeState.PAUSED, start=10)
    response = client_for(viewer).get(overview_url(cluster))
    assert response.context["degraded"] == {"out": 2, "total": 11}
    assert ('<strong>Degraded:</strong> <span data-degraded="out">2</span> of <span '
            'data-degraded="total">11</span> nodes are out of service') in response.text
    assert 'class="needs-you degraded-alert" role="alert"' in response.text  # styled as one
    assert 'data-degraded-threshold="10">' in response.text  # shown: not hidden


def test_needs_you_lists_the_unhealthy_nodes_worst_first_with_their_repair(client_for, viewer,
                                                                           cluster):
    from healthchecks.models import HealthEvent
    from repairs.tests.factories import RepairFactory

    now = timezone.now()
    warm = NodeFactory(cluster=cluster, name="gpu-002", state=NodeState.UNHEALTHY,
                       state_changed_at=now - timedelta(hours=2))
    lost = NodeFactory(cluster=cluster, name="gpu-009", state=NodeState.UNHEALTHY,
                       state_changed_at=now - timedelta(minutes=5))
    NodeFactory(cluster=cluster, name="gpu-001", state=NodeState.HEALTHY)
    HealthEvent.objects.create(node=warm, signature="thermal_throttle", severity="warning",
                               message="GPU 5: HW thermal slowdown", first_seen=now, last_seen=now)
    HealthEvent.objects.create(node=lost, signature="xid:79", severity="critical",
                               message="GPU has fallen off the bus", first_seen=now,
                               last_seen=now)
    repair = RepairFactory(node=lost)

    response = client_for(viewer).get(overview_url(cluster))

    rows = response.context["needs_you"]["rows"]
    assert [row["node"].name for row in rows] == ["gpu-009", "gpu-002"]  # critical first
    panel = response.text.split('id="needs-you"')[1].split("</table>")[0]
    assert panel.index("gpu-009") < panel.index("gpu-002") and "gpu-001" not in panel
    assert "GPU has fallen off the bus" in panel and "5\xa0minutes" in panel
    assert (f'href="/c/{cluster.slug}/repair/{repair.public_id}/">Review {repair.action} '
            f'#{repair.pk}</a>') in panel
    assert "no repair recommended: see the node" in panel


def test_needs_you_says_nothing_needs_you_and_refreshes_alone(client_for, viewer, cluster):
    NodeFactory(cluster=cluster, state=NodeState.HEALTHY)
    client = client_for(viewer)
    assert "Nothing: no node is unhealthy." in client.get(overview_url(cluster)).text
    part = client.get(overview_url(cluster), HTTP_HX_REQUEST="true", HTTP_HX_TARGET="needs-you")
    assert part.text.lstrip().startswith('<div id="needs-you"')
    assert 'id="timeline"' not in part.text


def test_the_timeline_leaves_routine_changes_out_unless_asked(client_for, viewer, cluster):
    node = NodeFactory(cluster=cluster, name="gpu-007")
    now = timezone.now()
    for minutes, (before, after, reason) in enumerate([
            ("", NodeState.PENDING, "registered"),
            (NodeState.PENDING, NodeState.BOOTING, "first hello from the agent"),
            (NodeState.BOOTING, NodeState.HEALTHY, "boot window ended"),
            (NodeState.HEALTHY, NodeState.UNHEALTHY, "xid:79 opened"),
            (NodeState.UNHEALTHY, NodeState.BOOTING, "rebooted (new boot id)")]):
        NodeTransitionFactory(node=node, from_state=before, to_state=after, reason=reason,
                              at=now - timedelta(minutes=10 - minutes))
    client = client_for(viewer)

    def reasons(**query):
        return [t.reason for t in client.get(overview_url(cluster, **query)).context["timeline"]]

    assert reasons() == ["rebooted (new boot id)", "xid:79 opened"]
    assert len(reasons(routine="on")) == 5
    assert reasons(state="booting") == ["rebooted (new boot id)", "first hello from the agent"]
    assert 'name="routine"' in client.get(overview_url(cluster)).text
