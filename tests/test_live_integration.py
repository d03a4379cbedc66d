"""Issue 3's "done when", over real sockets and processes: daphne in production mode against
the test database and Redis, the real agent (`python -m agent --simulate`), a real Celery
worker and beat, and browser-side WebSocket clients holding a viewer's session.

Each test gets a Redis database of its own (flushed before and after), so one test's
channel layer, live store and publisher lease never meet another's.
"""

import itertools
import json
import threading
import time
from datetime import datetime, timezone as dt_timezone

import pytest
from django.conf import settings
from django.test import Client

from agent.sim.backend import simulated_gpu_uuid
from clusters.roles import Role
from clusters.tests.factories import ClusterFactory, UserFactory
from healthchecks.models import HealthEvent
from nodes.choices import NodeState
from healthchecks.heartbeats import SIGNATURE as HEARTBEAT_LOST
from nodes.models import AgentEventReceipt, Gpu, Node, PublisherStatus
from gateway.publisher import LEASE_KEY, LEASE_MS, PUBLISH_EVERY_S
from nodes.services import do_issue_join_token

from .integration import parse_metrics, read_live_entries, redis_url_with_db, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

METRICS_TOKEN = "integration-metrics-token"
GPUS = 8

# Redis databases 1-15 (the session's daphne uses the REDIS_URL's own, 0), one per test.
_redis_dbs = itertools.cycle(range(1, 16))


@pytest.fixture
def redis_url():
    import redis

    if not settings.REDIS_URL:
        pytest.skip("integration tests need Redis: run them with `make test`")
    url = redis_url_with_db(settings.REDIS_URL, next(_redis_dbs))
    with redis.Redis.from_url(url) as client:
        client.flushdb()
    yield url
    with redis.Redis.from_url(url) as client:
        client.flushdb()


@pytest.fixture
def stack(redis_url, processes):
    """The test's ProcessGroup, set up as one production deployment on the test's Redis
    (its processes stop before that database is flushed).

    The boot window is 0: a node that said hello is healthy at once rather than booting for
    two minutes (booting would hide the unhealthy state these tests look for).
    """
    processes.env.update(
        REDIS_URL=redis_url,
        CLUSTERUI_METRICS_TOKEN=METRICS_TOKEN,
        CLUSTERUI_BOOT_WINDOW_S="0",
    )
    processes.redis_url = redis_url
    return processes


def joined_node(cluster, name, timeout=30.0, agent=None):
    """The node, once its agent's hello has been recorded."""
    def find():
        if agent is not None:
            agent.check_running()
        return Node.objects.filter(cluster=cluster, name=name,
                                   last_hello_at__isnull=False).first()

    return wait_until(find, timeout=timeout, what=f"{name} says hello and is registered")


def fresh(node):
    return Node.objects.get(pk=node.pk)


def gpu_util_series(server, hostname):
    status, body = server.get("/metrics", token=METRICS_TOKEN)
    assert status == 200, body
    return {labels["UUID"]: (labels, value) for name, labels, value in parse_metrics(body)
            if name == "DCGM_FI_DEV_GPU_UTIL" and labels.get("Hostname") == hostname}


def test_an_agent_registers_reports_samples_and_its_xid_is_stored_and_acked(stack):
    cluster = ClusterFactory(name="int-agent", slug="int-agent")
    _, join_token = do_issue_join_token(cluster)
    server = stack.daphne()
    agent = stack.agent("gpu-001", server, token=join_token, inject="xid:79@2s:gpu3")

    node = joined_node(cluster, "gpu-001", agent=agent)
    # It joined with the join token; the welcome's node token is kept for the next connect.
    wait_until(lambda: (agent.state_dir / "node_token").exists(), timeout=5,
               what="the agent stores its node token")
    assert (agent.state_dir / "node_token").read_text().strip().startswith("cun_")
    expected = [simulated_gpu_uuid("gpu-001", i) for i in range(GPUS)]
    gpus = list(Gpu.objects.filter(node=node).order_by("index"))
    assert [(g.index, g.uuid) for g in gpus] == list(enumerate(expected))
    assert {g.name for g in gpus} == {"NVIDIA H200"}
    assert all(g.memory_total_bytes and g.memory_total_bytes > 100 * 2**30 for g in gpus)

    # Samples reach the live store, and /metrics serves them under dcgm-exporter's names.
    assert server.get("/metrics")[0] == 401
    series = wait_until(lambda: (s := gpu_util_series(server, "gpu-001")) and len(s) == GPUS
                        and s, timeout=15, what="DCGM_FI_DEV_GPU_UTIL for the 8 GPUs")
    assert sorted(series) == sorted(expected)
    for uuid, (labels, value) in series.items():
        index = expected.index(uuid)
        assert labels["gpu"] == str(index)
        assert labels["device"] == f"nvidia{index}"
        assert labels["modelName"] == "NVIDIA H200"
        assert labels["cluster"] == "int-agent"
        assert 0 <= value <= 100

    # The injected Xid 79 on GPU 3: one open event, the node unhealthy because of it.
    event = wait_until(
        lambda: HealthEvent.objects.open().filter(node=node, signature="xid:79").first(),
        timeout=15, what="an open xid:79 event")
    assert event.count == 1
    assert event.gpu.index == 3 and event.gpu.uuid == expected[3]
    assert event.severity == "critical"
    node = fresh(node)
    assert node.state == NodeState.UNHEALTHY
    assert node.state_reason == "xid:79 on GPU 3"

    # Acked after commit: the outbox empties, and the event was stored once.
    wait_until(lambda: agent.outbox_ids() == [], timeout=10, what="the agent's outbox empties")
    receipts = list(AgentEventReceipt.objects.filter(node=node))
    assert [r.health_event_id for r in receipts] == [event.pk]
    assert HealthEvent.objects.filter(node=node).count() == 1
    assert HealthEvent.objects.get(pk=event.pk).count == 1

    xids = {labels["gpu"]: value for name, labels, value
            in parse_metrics(server.get("/metrics", token=METRICS_TOKEN)[1])
            if name == "DCGM_FI_DEV_XID_ERRORS" and labels.get("Hostname") == "gpu-001"}
    assert xids == {str(i): (79.0 if i == 3 else 0.0) for i in range(GPUS)}
    agent.check_running()


def sweeps_done(worker):
    """How many heartbeat sweeps the worker has finished (its INFO log says each)."""
    return sum("healthchecks.tasks.sweep_heartbeats[" in line and " succeeded " in line
               for line in worker.log_text().splitlines())


def test_a_killed_agent_loses_its_heartbeat_and_a_restarted_one_gets_it_back(stack):
    """Sample interval 0.5 s, so 6 intervals = 3 s of silence; the grace after the
    publisher starts is 1 s. The node is lost neither while its agent reports nor before
    6 intervals of silence, and at most a few seconds of publishing and sweeping after that.
    (6 intervals, not the default 3: on a busy 2-core machine an agent or server can stall
    for more than 1.5 s, a false alarm that is not what this test is about.)"""
    interval, intervals = 0.5, 6
    timing = dict(CLUSTERUI_SAMPLE_INTERVAL_S=interval, CLUSTERUI_HEARTBEAT_INTERVALS=intervals,
                  CLUSTERUI_HEARTBEAT_GRACE_S=1)
    stack.env.update({k: str(v) for k, v in timing.items()})
    cluster = ClusterFactory(name="int-heartbeat", slug="int-heartbeat")
    _, join_token = do_issue_join_token(cluster)
    server = stack.daphne()
    worker = stack.celery("worker", "--concurrency=1", "-P", "solo", "--without-heartbeat",
                          "--without-gossip", "--without-mingle")
    beat = stack.celery("beat", "-s", stack.directory / "beat-schedule",
                        "--max-interval", "1")
    agent = stack.agent("gpu-001", server, token=join_token)

    node = joined_node(cluster, "gpu-001", agent=agent)
    wait_until(lambda: worker.check_running() or " ready." in worker.log_text(),
               timeout=30, what="the Celery worker is ready")

    # While the agent reports, sweeps run and find nothing: the node stays healthy. Wait for
    # three sweeps after the grace (publisher start + 1 s + 3 intervals): not vacuous.
    def judging():
        beat.check_running()
        status = PublisherStatus.objects.first()
        return status and (datetime.now(tz=dt_timezone.utc) - status.started_at
                           ).total_seconds() > 1 + interval * intervals

    wait_until(judging, timeout=30, what="the publisher has run past the heartbeat grace")
    swept = sweeps_done(worker)
    wait_until(lambda: sweeps_done(worker) >= swept + 3, timeout=15,
               what="three heartbeat sweeps after the grace")
    false_alarm = HealthEvent.objects.filter(node=node, signature=HEARTBEAT_LOST).first()
    assert false_alarm is None, (
        f"heartbeat_lost opened for an agent that was reporting: {false_alarm.evidence}")
    assert fresh(node).state == NodeState.HEALTHY

    # SIGKILL: no close frame, no goodbye. The sweep must notice the silence.
    agent.kill()
    killed_at = time.time()
    lost = wait_until(
        lambda: HealthEvent.objects.open().filter(node=node, signature=HEARTBEAT_LOST).first(),
        timeout=15, what="an open heartbeat_lost event after the kill", interval=0.02)
    seen_at = time.time()
    last_frame = read_live_entries(stack.redis_url, cluster.pk)[node.pk]["received_at"]
    detected_s = lost.first_seen.timestamp() - killed_at
    silence_s = lost.first_seen.timestamp() - last_frame
    print(f"heartbeat_lost opened {detected_s:.2f} s after SIGKILL ({silence_s:.2f} s after "
          f"the last frame; seen by the test {seen_at - killed_at:.2f} s after the kill)")
    node = fresh(node)
    assert node.state == NodeState.UNHEALTHY
    assert node.state_reason == HEARTBEAT_LOST
    # Not before 6 intervals of silence...
    assert silence_s >= interval * intervals, (
        f"heartbeat_lost after only {silence_s:.2f} s of silence (limit "
        f"{interval * intervals:g} s)")
    # ...and at most: 6 intervals of silence (3 s), the publisher's next last_seen write
    # (<= 1 s) and the beat's next sweep (<= 1 s), plus 2.5 s for the store's 100 ms flush,
    # the worker picking the task up and the commit on a busy 2-core machine.
    bound = interval * intervals + 1.0 + 1.0 + 2.5
    assert detected_s <= bound, f"heartbeat_lost {detected_s:.2f} s after the kill (> {bound} s)"

    # The agent comes back (same state dir: its node token, same boot id): the event closes.
    agent.start()
    restarted_at = time.time()
    wait_until(lambda: fresh(node).state == NodeState.HEALTHY, timeout=20,
               what="the node is healthy again after the agent restarted")
    print(f"healthy again {time.time() - restarted_at:.2f} s after the agent restarted")
    lost.refresh_from_db()
    assert lost.closed_at is not None
    assert lost.closed_reason == "the agent is reporting again"
    assert HealthEvent.objects.open().filter(node=node).count() == 0
    assert "rebooted" not in fresh(node).transitions.first().reason
    for process in (server, worker, beat, agent):
        process.check_running()


def test_an_agent_stays_connected_to_a_server_that_no_browser_watches(stack):
    """A server process with agents and no browser: nothing arrives on its channel layer, so
    Channels' receive sits in Redis' blocking pop (5 s at a time) for as long as the agents
    stay. The agent's connection must simply stay up, and every sample arrive."""
    stack.env.update(CLUSTERUI_SAMPLE_INTERVAL_S="0.5")
    cluster = ClusterFactory(name="int-idle", slug="int-idle")
    _, join_token = do_issue_join_token(cluster)
    server = stack.daphne()
    agent = stack.agent("gpu-001", server, token=join_token)
    node = joined_node(cluster, "gpu-001", agent=agent)
    connected_at = time.time()

    # Past the first blocking pop (5 s) and daphne's check of its applications (1 s).
    wait_until(lambda: agent.check_running() or time.time() > connected_at + 7.5, timeout=10,
               what="7.5 s of connection")
    entry = read_live_entries(stack.redis_url, cluster.pk)[node.pk]
    read_at = time.time()
    log = agent.log_text()
    assert log.count("connected to ") == 1 and "ended (close" not in log, (
        "the agent's connection did not last:\n" + agent.log_tail(20))
    assert "Exception inside application" not in server.log_text(), server.log_tail(40)
    # One connection, so its seq counts every sample since the hello: none went missing
    # (up to 3 short: samples still on their way on a busy machine).
    assert read_at - entry["received_at"] < 1.5
    assert entry["seq"] >= (entry["received_at"] - connected_at) / 0.5 - 3, entry["seq"]


def test_last_seen_is_when_the_nodes_latest_frame_arrived(stack):
    """The heartbeat sweep measures silence from Node.last_seen, which the publisher writes
    from the live store's `received_at`. Written earlier than the latest frame (rounded down
    to the second, say), it makes the sweep count up to a second of silence that was not
    there: a reporting node is called lost, and a silent one before 3 intervals.

    The agent is killed right after a frame that arrived mid-second (0.25-0.75 s past it), so
    a rounding to the second cannot go unnoticed; 0.15 s allows the store's 100 ms flush."""
    stack.env.update(CLUSTERUI_SAMPLE_INTERVAL_S="0.5")
    cluster = ClusterFactory(name="int-last-seen", slug="int-last-seen")
    _, join_token = do_issue_join_token(cluster)
    server = stack.daphne()
    agent = stack.agent("gpu-001", server, token=join_token)
    node = joined_node(cluster, "gpu-001", agent=agent)

    def latest_frame():
        return read_live_entries(stack.redis_url, cluster.pk).get(node.pk)

    hello_at = node.last_hello_at.timestamp()  # the hello also sets last_seen

    def mid_second_frame_just_arrived():
        agent.check_running()
        entry = latest_frame()
        return (entry and entry["received_at"] > hello_at + 0.3
                and time.time() - entry["received_at"] < 0.25
                and 0.25 <= entry["received_at"] % 1 < 0.75)

    wait_until(mid_second_frame_just_arrived, timeout=10, interval=0.01,
               what="a frame that arrived 0.25-0.75 s past a second")
    agent.kill()  # before the next frame, 0.5 s later

    def last_seen_and_frame():
        last_seen = fresh(node).last_seen.timestamp()
        received_at = latest_frame()["received_at"]
        return last_seen, received_at

    try:
        wait_until(lambda: (lambda seen, frame: seen >= frame - 0.15)(*last_seen_and_frame()),
                   timeout=3, what="last_seen reaches the latest frame")
    except AssertionError:
        seen, frame = last_seen_and_frame()
        raise AssertionError(
            f"Node.last_seen is {frame - seen:.3f} s before the node's latest frame "
            f"(last_seen {datetime.fromtimestamp(seen, dt_timezone.utc).isoformat()}, "
            f"frame received {datetime.fromtimestamp(frame, dt_timezone.utc).isoformat()})"
        ) from None
    server.check_running()


def test_an_event_raised_while_the_server_is_down_is_stored_once_after_it_restarts(stack):
    cluster = ClusterFactory(name="int-outbox", slug="int-outbox")
    _, join_token = do_issue_join_token(cluster)
    server = stack.daphne()
    # The Xid fires 10 s after the agent starts: it joins in about 1 s, and the server is down
    # about 1 s later, with room to spare on a slow machine (the assertion after the stop says
    # so if not).
    agent = stack.agent("gpu-001", server, token=join_token, inject="xid:79@10s:gpu3")
    node = joined_node(cluster, "gpu-001", agent=agent)
    wait_until(lambda: read_live_entries(stack.redis_url, cluster.pk).get(node.pk),
               timeout=10, what="a sample from the agent in the live store")

    server.stop()
    assert "event xid:79" not in agent.log_text(), "the Xid fired before the server was down"
    wait_until(lambda: "event xid:79" in agent.log_text(), timeout=25,
               what="the agent raises the Xid while the server is down")
    pending = agent.outbox_ids()
    assert len(pending) == 1, pending
    assert not server.running()
    assert not HealthEvent.objects.filter(node=node).exists()

    server.start().wait_listening()
    wait_until(lambda: agent.outbox_ids() == [], timeout=40,
               what="the agent reconnects and its outbox empties (acked)")
    receipts = list(AgentEventReceipt.objects.filter(node=node))
    assert [str(r.event_id) for r in receipts] == pending
    events = list(HealthEvent.objects.filter(node=node))
    assert len(events) == 1
    assert events[0].signature == "xid:79" and events[0].count == 1
    assert receipts[0].health_event_id == events[0].pk
    assert fresh(node).state_reason == "xid:79 on GPU 3"
    agent.check_running()


class SummaryReader:
    """A browser's live socket (/ws/live/cluster/<slug>/) with a viewer's session cookie and
    this site's Origin, read in a thread: every summary with the time it arrived."""

    def __init__(self, server, slug, sessionid):
        self.url = f"ws://127.0.0.1:{server.port}/ws/live/cluster/{slug}/"
        self.origin = server.url
        self.cookie = f"sessionid={sessionid}"
        self.summaries = []
        self.opened = threading.Event()
        self.done = threading.Event()
        self.error = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        if not self.opened.wait(timeout=15) or self.error is not None:
            raise AssertionError(f"{self.url}: did not open: {self.error!r}")

    def _read(self):
        from websockets.exceptions import ConnectionClosed
        from websockets.sync.client import connect

        try:
            with connect(self.url, origin=self.origin, open_timeout=10, proxy=None,
                         additional_headers={"Cookie": self.cookie}) as socket:
                self.opened.set()
                while not self.done.is_set():
                    try:
                        message = socket.recv(timeout=0.2)
                    except TimeoutError:
                        continue
                    frame = json.loads(message)
                    if "type" not in frame:  # a summary; typed messages (health.changed) are not
                        self.summaries.append((time.monotonic(), frame))
        except ConnectionClosed as exc:
            self.error = exc
        except Exception as exc:  # reported by the waits that see no summaries
            self.error = exc
            self.opened.set()

    def close(self):
        self.done.set()
        self.thread.join(timeout=5)


def test_two_servers_share_one_live_store_and_one_publisher(stack):
    cluster = ClusterFactory(name="int-two", slug="int-two")
    _, join_token = do_issue_join_token(cluster)
    UserFactory(username="vera", role=Role.VIEWER)
    client = Client()
    assert client.login(username="vera", password="password")
    sessionid = client.cookies[settings.SESSION_COOKIE_NAME].value

    one = stack.daphne("daphne-1", start=False).start()
    two = stack.daphne("daphne-2", start=False).start()
    one.wait_listening()
    two.wait_listening()
    agent_a = stack.agent("gpu-a", one, token=join_token)
    agent_b = stack.agent("gpu-b", two, token=join_token)
    # Without the viewer's session the live socket is refused.
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    with pytest.raises(InvalidStatus) as refused:
        connect(f"ws://127.0.0.1:{one.port}/ws/live/cluster/{cluster.slug}/", origin=one.url,
                open_timeout=10, proxy=None).close()
    assert refused.value.response.status_code == 403

    readers = []
    try:
        readers = [SummaryReader(one, cluster.slug, sessionid),
                   SummaryReader(two, cluster.slug, sessionid)]

        def both_nodes(reader):
            agent_a.check_running()
            agent_b.check_running()
            return [t for t, s in reader.summaries
                    if (s.get("usage") or {}).get("gpus_reporting") == 2 * GPUS
                    and s["counts"][NodeState.HEALTHY] == 2]

        for reader, server in zip(readers, (one, two)):
            wait_until(lambda: both_nodes(reader), timeout=30,
                       what=f"a summary on {server.name} shows both nodes (16 GPUs)")

        # Over the next 4 s both browsers get the same summaries, about one a second: one
        # publisher for the deployment (two would send two a second, with different `at`).
        start = time.monotonic()
        wait_until(lambda: time.monotonic() > start + 4.2, timeout=6, what="4 s of summaries")
        window = [[s for t, s in reader.summaries if start <= t <= start + 4.0]
                  for reader in readers]
        ats = [[s["at"] for s in summaries] for summaries in window]
        assert 2 <= len(ats[0]) <= 5, ats[0]
        gaps = [round(b - a, 3) for a, b in zip(ats[0], ats[0][1:])]
        print(f"{len(ats[0])} summaries in 4 s on daphne-1, {len(ats[1])} on daphne-2; "
              f"gaps between their `at`: {gaps} s")
        # Two publishers interleave (gaps under 0.5 s); a slow tick on a busy machine is not.
        assert all(0.5 <= gap <= 2.5 for gap in gaps), gaps
        # The same messages on both servers (the window's edges may hold one more or less).
        everything = [{s["at"] for t, s in reader.summaries} for reader in readers]
        assert set(ats[0][1:-1]) <= everything[1], (ats[0], sorted(everything[1]))
        assert set(ats[1][1:-1]) <= everything[0], (ats[1], sorted(everything[0]))
        for summaries in window:
            assert all(s["usage"]["gpus_reporting"] == 2 * GPUS for s in summaries), summaries

        import redis

        with redis.Redis.from_url(stack.redis_url) as r:
            holder = r.get(LEASE_KEY).decode()
        leaders = [server.name for server in (one, two)
                   if holder.startswith(f"{server.pid}-")]  # "<pid>-<random>"
        assert len(leaders) == 1, holder
        print(f"the publisher lease is held by {leaders[0]}")
    finally:
        for reader in readers:
            reader.close()
    nodes = Node.objects.filter(cluster=cluster)
    assert sorted(nodes.values_list("name", flat=True)) == ["gpu-a", "gpu-b"]
    assert all(node.last_seen is not None for node in nodes)


def test_a_killed_publisher_is_replaced_once_its_lease_expires_and_its_nodes_stay_watched(
        stack):
    """Two server processes; the one leading the publisher is killed (SIGKILL, no goodbye).
    The other takes the lease over once it expires (3 s) and ticks within about 6 s, and a
    node it keeps hearing that then goes silent loses its heartbeat at once: the take-over's
    reconnection grace (30 s) is only for the nodes it has not heard since."""
    import redis

    from healthchecks.heartbeats import sweep_heartbeats

    cluster = ClusterFactory(name="int-handover", slug="int-handover")
    _, join_token = do_issue_join_token(cluster)
    first = stack.daphne("daphne-1")
    # A server's publisher starts with its first connection.
    gone = stack.agent("gpu-gone", first, token=join_token)
    joined_node(cluster, "gpu-gone", agent=gone)

    def holder():
        with redis.Redis.from_url(stack.redis_url) as r:
            value = r.get(LEASE_KEY)
        return value.decode() if value else None

    wait_until(lambda: (holder() or "").startswith(f"{first.pid}-"), timeout=20,
               what="daphne-1 leads the publisher")
    second = stack.daphne("daphne-2")
    agent = stack.agent("gpu-kept", second, token=join_token)
    node = joined_node(cluster, "gpu-kept", agent=agent)
    wait_until(lambda: fresh(node).last_seen is not None, timeout=20,
               what="gpu-kept's samples reach last_seen")

    first.kill()
    killed_at = time.time()
    took_over = wait_until(lambda: (holder() or "").startswith(f"{second.pid}-")
                           and PublisherStatus.objects.get().seen_at.timestamp() > killed_at
                           and time.time(), timeout=10, what="daphne-2 takes the publisher over")
    print(f"daphne-2 ticked as the publisher {took_over - killed_at:.1f} s after the kill")
    # The lease expires (3 s), the next publish second takes it and ticks (a tick still
    # running defers that by another second), plus 1 s for a busy machine.
    bound = LEASE_MS / 1000 + 2 * PUBLISH_EVERY_S + 1.0
    assert took_over - killed_at <= bound, f"{took_over - killed_at:.1f} s > {bound:g} s"
    status = PublisherStatus.objects.get()
    assert status.started_at.timestamp() > killed_at - 1  # a (re)start: the grace begins

    wait_until(lambda: fresh(node).last_seen > status.started_at, timeout=10,
               what="daphne-2 hears gpu-kept after taking over")
    agent.kill()  # gpu-kept goes silent; the console heard it after the take-over
    silent_from = time.time()
    wait_until(lambda: sweep_heartbeats() and HealthEvent.objects.open().filter(
        node=node, signature=HEARTBEAT_LOST).exists(), timeout=15,
        what="gpu-kept's heartbeat_lost opens within the grace period")
    assert time.time() - silent_from < settings.CLUSTERUI_HEARTBEAT_GRACE_S
    # gpu-gone's server died with it: it is reconnecting, and has its grace.
    assert not HealthEvent.objects.filter(node__name="gpu-gone").exists()


def test_agent_gateways_that_never_lead_hand_their_samples_to_the_publisher_process(stack):
    """Production for large fleets (README.md): an agent gateway with
    CLUSTERUI_PUBLISHER_LEADS=false never takes the publisher's lease and folds nothing; the
    publisher process (`manage.py publisher`) leads, folds the samples the gateway hands it
    through Redis and writes the node's last_seen; stopped, it gives the lease up at once."""
    import redis

    cluster = ClusterFactory(name="int-publisher", slug="int-publisher")
    _, join_token = do_issue_join_token(cluster)
    gateway = stack.gateway("gateway", CLUSTERUI_PUBLISHER_LEADS="false")
    agent = stack.agent("gpu-p", gateway, token=join_token)
    node = joined_node(cluster, "gpu-p", agent=agent)

    def holder():
        with redis.Redis.from_url(stack.redis_url) as r:
            value = r.get(LEASE_KEY)
        return value.decode() if value else None

    wait_until(lambda: read_live_entries(stack.redis_url, cluster.pk), timeout=20,
               what="gpu-p's samples reach the live store")
    said_hello = fresh(node).last_seen
    time.sleep(2 * PUBLISH_EVERY_S)  # the gateway's lease renewals, which must not take it
    assert holder() is None
    assert not PublisherStatus.objects.exists()  # nobody ticks, nor folds, nobody leads
    assert fresh(node).last_seen == said_hello

    # As the deployment files set it for every process: the publisher process leads anyway.
    publisher = stack.publisher(CLUSTERUI_PUBLISHER_LEADS="false")
    wait_until(lambda: (holder() or "").startswith(f"{publisher.pid}-"), timeout=20,
               what="the publisher process leads")
    wait_until(lambda: fresh(node).last_seen > said_hello, timeout=10,
               what="the publisher folds gpu-p's samples, handed over by the gateway")

    stopping = time.monotonic()
    publisher.stop()
    assert holder() is None
    # Renewed at most a second before the stop, the lease would still have held for 2 s
    # more: gone within them, it was given up, not let expire.
    assert time.monotonic() - stopping < LEASE_MS / 1000 - PUBLISH_EVERY_S
    assert "Traceback" not in publisher.log_text(), publisher.log_tail()
