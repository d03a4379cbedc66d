"""The Nodes tab: list and grid, live numbers, filters, sorting and their query counts."""

import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from healthchecks.models import HealthEvent
from nodes.choices import NodeState
from gateway.protocol import live_sample
from nodes.live_store import get_live_store, reset_live_store
from nodes.models import Gpu, Node

from .factories import GpuFactory, NodeFactory

pytestmark = pytest.mark.django_db
GIB = 2**30


@pytest.fixture(autouse=True)
def store(settings):
    settings.REDIS_URL = ""
    # Samples stay fresh for 10 minutes however slowly a test runs; the stale cases use -1 h.
    settings.CLUSTERUI_HEARTBEAT_INTERVALS = 600
    reset_live_store()
    yield get_live_store()
    reset_live_store()


def list_url(cluster, query=""):
    return reverse("nodes:list", args=[cluster.slug]) + query


def record_sample(store, node, utils, *, temps=None, received_at=None):
    """A live sample of the node: one GPU per value in `utils`, 80 GiB each, half used."""
    received_at = time.time() if received_at is None else received_at
    temps = temps or [50] * len(utils)
    frame = {"type": "sample", "seq": 1, "ts": received_at, "node": {},
             "gpus": [{"uuid": f"{node.name}-{i}", "util_pct": util, "mem_used_bytes": 40 * GIB,
                       "temp_c": temp, "power_w": 500.0} for i, (util, temp) in
                      enumerate(zip(utils, temps))]}
    totals = {f"{node.name}-{i}": 80 * GIB for i in range(len(utils))}
    store.record(node.cluster_id, live_sample(frame, node_id=node.pk, received_at=received_at,
                                             memory_totals=totals))


def open_event(node, signature, severity="critical", gpu=None):
    now = timezone.now()
    return HealthEvent.objects.create(node=node, gpu=gpu, signature=signature, severity=severity,
                                      message=signature, first_seen=now, last_seen=now)


def test_the_list_shows_live_numbers_and_the_worst_open_signal(client_for, viewer, cluster,
                                                                 store):
    node = NodeFactory(cluster=cluster, name="gpu-017", state=NodeState.UNHEALTHY)
    gpu = GpuFactory(node=node, index=3)
    record_sample(store, node, [20, 100], temps=[55, 83])
    open_event(node, "thermal_throttle", severity="warning")
    open_event(node, "xid:79", gpu=gpu)
    NodeFactory(cluster=cluster, name="gpu-018")

    response = client_for(viewer).get(list_url(cluster))

    row, quiet = response.context["nodes"]
    assert row.live["util_mean"] == 60 and row.live["util_max"] == 100
    assert (row.live["mem_used_pct"], row.live["temp_max"], row.live["power_w"]) == (50, 83, 1000)
    # The worst open signal, drawn by health's template tag: critical before warning.
    row_html, quiet_html = (response.text.split(f'data-node="{name}"')[1].split("</tr>")[0]
                            for name in ("gpu-017", "gpu-018"))
    assert "xid:79 on GPU 3" in row_html and "thermal_throttle" not in row_html
    assert quiet.live is None and '<span class="muted">none</span>' in quiet_html
    for text in ["60 %", "100 %", "50 %", "83 °C", "1000 W", "xid:79 on GPU 3",
                 "no sample now"]:
        assert text in response.text


def test_a_stale_sample_is_not_shown(client_for, viewer, cluster, store):
    node = NodeFactory(cluster=cluster)
    record_sample(store, node, [90], received_at=time.time() - 3600)
    response = client_for(viewer).get(list_url(cluster))
    assert response.context["nodes"][0].live is None


def test_the_list_filters_by_open_signature_and_text(client_for, viewer, cluster):
    a = NodeFactory(cluster=cluster, name="gpu-001", hostname="rack1-a.internal")
    b = NodeFactory(cluster=cluster, name="gpu-002", hostname="rack2-b.internal")
    NodeFactory(cluster=cluster, name="gpu-003", hostname="rack2-c.internal")
    open_event(a, "xid:79")
    closed = open_event(b, "xid:79")
    HealthEvent.objects.filter(pk=closed.pk).update(closed_at=timezone.now())
    open_event(b, "gpu_lost")
    client = client_for(viewer)

    def names(query):
        return [n.name for n in client.get(list_url(cluster, query)).context["nodes"]]

    assert names("?signature=xid:79") == ["gpu-001"]  # a closed event does not count
    assert names("?signature=gpu_lost") == ["gpu-002"]
    assert names("?name=rack2") == ["gpu-002", "gpu-003"]  # the hostname matches too
    assert names("?name=rack2&signature=gpu_lost") == ["gpu-002"]
    assert "No node matches these filters." in client.get(list_url(cluster, "?signature=x")).text


def test_the_list_sorts_by_name_state_last_seen_and_live_numbers(client_for, viewer, cluster,
                                                                  store):
    now = timezone.now()
    a = NodeFactory(cluster=cluster, name="a", state=NodeState.UNHEALTHY,
                    last_seen=now - timezone.timedelta(minutes=5))
    b = NodeFactory(cluster=cluster, name="b", state=NodeState.HEALTHY, last_seen=now)
    c = NodeFactory(cluster=cluster, name="c", state=NodeState.BOOTING,
                    last_seen=now - timezone.timedelta(minutes=1))
    NodeFactory(cluster=cluster, name="d", state=NodeState.PAUSED,
                last_seen=now - timezone.timedelta(hours=1))
    record_sample(store, a, [10], temps=[90])
    record_sample(store, b, [95], temps=[40])
    record_sample(store, c, [50], temps=[60])
    client = client_for(viewer)

    def names(sort):
        return "".join(n.name for n in client.get(list_url(cluster, f"?sort={sort}"))
                       .context["nodes"])

    assert names("name") == "abcd"
    assert names("state") == "cbda"  # booting, healthy, paused, unhealthy
    assert names("last_seen") == "bcad"
    assert names("util") == "bcad"  # highest first; no sample last
    assert names("temp") == "acbd"
    assert names("nonsense") == names("severity")  # the default


def test_the_list_opens_worst_first(client_for, viewer, cluster):
    """Unhealthy with a critical open event, unhealthy, pending, booting, paused, healthy;
    then by name."""
    for name, state in [("a-healthy", NodeState.HEALTHY), ("b-paused", NodeState.PAUSED),
                        ("c-warning", NodeState.UNHEALTHY), ("d-booting", NodeState.BOOTING),
                        ("e-pending", NodeState.PENDING), ("f-critical", NodeState.UNHEALTHY),
                        ("g-warning", NodeState.UNHEALTHY), ("h-healthy", NodeState.HEALTHY)]:
        NodeFactory(cluster=cluster, name=name, state=state)
    open_event(Node.objects.get(name="c-warning"), "thermal", severity="warning")
    critical = Node.objects.get(name="f-critical")
    open_event(critical, "thermal", severity="warning")
    open_event(critical, "xid:79")
    closed = open_event(Node.objects.get(name="g-warning"), "xid:48")
    HealthEvent.objects.filter(pk=closed.pk).update(closed_at=timezone.now())
    response = client_for(viewer).get(list_url(cluster))
    assert [node.name for node in response.context["nodes"]] == [
        "f-critical", "c-warning", "g-warning", "e-pending", "d-booting", "b-paused",
        "a-healthy", "h-healthy"]
    assert response.context["sort"] == "severity"


def test_a_live_sort_pages_through_every_node(client_for, viewer, cluster, store):
    nodes = [NodeFactory(cluster=cluster, name=f"n{i:03d}") for i in range(60)]
    for i, node in enumerate(nodes):
        record_sample(store, node, [i])
    client = client_for(viewer)
    first = client.get(list_url(cluster, "?sort=util")).context["page"]
    second = client.get(list_url(cluster, "?sort=util&page=2")).context["page"]
    assert [n.name for n in first][:2] == ["n059", "n058"]
    assert [n.name for n in second] == [f"n{i:03d}" for i in range(9, -1, -1)]
    assert first.paginator.count == 60


def test_the_grid_shows_one_tile_per_node_linking_to_it(client_for, viewer, cluster, store):
    busy = NodeFactory(cluster=cluster, name="gpu-001", state=NodeState.UNHEALTHY)
    NodeFactory(cluster=cluster, name="gpu-002", state=NodeState.PAUSED)
    open_event(busy, "xid:79")
    record_sample(store, busy, [70, 80])

    response = client_for(viewer).get(list_url(cluster, "?view=grid"))

    text = response.text
    assert text.count('class="tile ') == 2
    assert ('<a class="tile unhealthy u8" href="/c/prod-h200/nodes/gpu-001/" '
            'title="gpu-001 · unhealthy · 75 % · xid:79"><span>gpu-001</span></a>') in text
    assert ('<a class="tile paused" href="/c/prod-h200/nodes/gpu-002/" '
            'title="gpu-002 · paused"><span>gpu-002</span></a>') in text
    assert '<div class="node-grid labelled">' in text  # room for the names
    assert response.context["page"] is None  # every node on one screen, no pages


def test_a_grid_of_more_nodes_than_there_is_room_to_name_has_small_tiles(
        client_for, viewer, cluster, monkeypatch):
    from nodes import queries

    monkeypatch.setattr(queries, "GRID_LABELS_UP_TO", 2)
    for name in ("gpu-001", "gpu-002", "gpu-003"):
        NodeFactory(cluster=cluster, name=name)
    text = client_for(viewer).get(list_url(cluster, "?view=grid")).text
    assert '<div class="node-grid">' in text and "<span>gpu-001</span>" not in text
    assert ('<a class="tile healthy" href="/c/prod-h200/nodes/gpu-001/" '
            'title="gpu-001 · healthy"></a>') in text


def test_the_grid_has_a_legend_with_each_states_count(client_for, viewer, cluster):
    for name, state in [("a", NodeState.HEALTHY), ("b", NodeState.HEALTHY),
                        ("c", NodeState.UNHEALTHY), ("d", NodeState.PAUSED)]:
        NodeFactory(cluster=cluster, name=name, state=state)
    response = client_for(viewer).get(list_url(cluster, "?view=grid"))
    assert response.context["legend"] == [("healthy", "healthy", 2), ("booting", "booting", 0),
                                          ("unhealthy", "unhealthy", 1),
                                          ("pending", "pending", 0), ("paused", "paused", 1)]
    text = response.content.decode()
    assert ('<li><span class="swatch unhealthy u10" aria-hidden="true"></span> unhealthy '
            '<span class="muted">1</span></li>') in text
    assert "GPU utilization 0 (or no sample now), 50, 100 %" in text


def test_the_list_shows_and_filters_by_role(client_for, viewer, cluster):
    NodeFactory(cluster=cluster, name="gpu-001")
    NodeFactory(cluster=cluster, name="login-1", role="login")
    client = client_for(viewer)

    def names(query):
        return [n.name for n in client.get(list_url(cluster, query)).context["nodes"]]

    assert names("?role=login") == ["login-1"]
    assert names("?role=worker") == ["gpu-001"]
    response = client.get(list_url(cluster))
    assert "<th>role</th>" in response.text and "<td>login</td>" in response.text
    refused = client.get(list_url(cluster, "?role=gpu"))
    assert list(refused.context["nodes"]) == [] and "Select a valid choice" in refused.text
    assert "No node matches these filters." in client.get(list_url(cluster, "?role=controller")).text


def test_the_grid_keeps_the_filters(client_for, viewer, cluster):
    NodeFactory(cluster=cluster, name="gpu-001", state=NodeState.HEALTHY)
    NodeFactory(cluster=cluster, name="gpu-002", state=NodeState.PAUSED)
    response = client_for(viewer).get(list_url(cluster, "?view=grid&state=paused"))
    assert [n.name for n in response.context["nodes"]] == ["gpu-002"]
    assert 'name="view" value="grid"' in response.text


def test_an_htmx_refresh_gets_only_the_table_and_polls_the_same_query(client_for, viewer,
                                                                       cluster):
    NodeFactory(cluster=cluster)
    response = client_for(viewer).get(list_url(cluster, "?state=healthy&sort=temp&page=1"),
                                      HTTP_HX_REQUEST="true")
    text = response.text.lstrip()
    assert text.startswith('<div id="node-table" hx-get="/c/prod-h200/nodes/?state=healthy'
                           '&amp;sort=temp&amp;page=1"')
    assert 'hx-trigger="cluster-changed from:body throttle:1s, every 5s"' in text
    assert "<h1>" not in text


def test_viewers_get_no_checkboxes_operators_do(client_for, viewer, operator, cluster):
    NodeFactory(cluster=cluster, name="gpu-001")
    assert 'name="nodes"' not in client_for(viewer).get(list_url(cluster)).text
    text = client_for(operator).get(list_url(cluster)).text
    assert 'name="nodes" value="gpu-001"' in text and 'id="select-all"' in text


def add_nodes(cluster, store, start, count):
    """`count` nodes with 8 GPUs, a live sample each, and an open event on every tenth."""
    now = timezone.now()
    nodes = Node.objects.bulk_create(
        Node(cluster=cluster, name=f"n{i:05d}", state=NodeState.HEALTHY, joined_at=now,
             last_seen=now) for i in range(start, start + count))
    Gpu.objects.bulk_create(Gpu(node=n, index=i, uuid=f"GPU-{n.name}-{i}")
                            for n in nodes for i in range(8))
    HealthEvent.objects.bulk_create(
        HealthEvent(node=n, signature="xid:79", severity="critical", first_seen=now,
                    last_seen=now) for n in nodes[::10])
    for node in nodes:
        record_sample(store, node, [i * 10 for i in range(8)])


@pytest.mark.parametrize("query", ["", "?sort=util&page=3", "?sort=last_seen&page=2",
                                   "?view=grid", "?view=grid&signature=xid:79"])
def test_queries_do_not_grow_with_the_number_of_nodes(client_for, operator, cluster, store,
                                                      query, django_assert_num_queries):
    client = client_for(operator)
    add_nodes(cluster, store, 0, 10)
    client.get(list_url(cluster, query))
    with CaptureQueriesContext(connection) as at_10:
        client.get(list_url(cluster, query))
    add_nodes(cluster, store, 10, 1990)
    started = time.monotonic()
    with django_assert_num_queries(len(at_10)):
        response = client.get(list_url(cluster, query))
    print(f"{query or 'list'}: {len(at_10)} queries at 10 and 2,000 nodes; "
          f"{len(response.content):,} bytes, {time.monotonic() - started:.2f} s at 2,000")
    assert response.status_code == 200
    shown = response.context["nodes"]
    if "grid" in query:
        assert len(shown) == (200 if "signature" in query else 2000)
    else:
        assert len(shown) == 50 and all(node.live for node in shown)


def test_the_grid_of_2000_nodes_is_compact(client_for, viewer, cluster, store):
    add_nodes(cluster, store, 0, 2000)
    response = client_for(viewer).get(list_url(cluster, "?view=grid"))
    assert response.text.count('class="tile ') == 2000
    size = len(response.content)
    print(f"grid page at 2,000 nodes: {size:,} bytes")
    assert size < 300_000


def test_the_slurm_state_of_the_latest_hello_is_stored_and_listed(client_for, viewer, cluster):
    from nodes.services import do_record_hello

    node = NodeFactory(cluster=cluster, name="gpu-001")
    do_record_hello(node, boot_id="b1", slurm={"state": "DRAIN", "reason": "xid"})
    node.refresh_from_db()
    assert node.slurm_state == "DRAIN"
    assert '<td class="mono">DRAIN</td>' in client_for(viewer).get(list_url(cluster)).text

    do_record_hello(node, boot_id="b1", slurm=None)  # a node without Slurm
    node.refresh_from_db()
    assert node.slurm_state == ""


def test_in_production_the_list_reads_the_live_numbers_from_redis(client_for, viewer, cluster,
                                                                  redis_live_store):
    """The production store (Redis, written by another process): the same numbers."""
    import asyncio

    node = NodeFactory(cluster=cluster, name="gpu-001")
    writer = redis_live_store()
    record_sample(writer, node, [30, 50], temps=[61, 77])
    asyncio.run(writer.flush())
    reset_live_store()  # the view reads on a connection of its own, as another process

    response = client_for(viewer).get(list_url(cluster))

    (row,) = response.context["nodes"]
    assert (row.live["util_mean"], row.live["temp_max"]) == (40, 77)
