"""Redis and PostgreSQL restarting under a running deployment (issue 14, point 7): each test
starts a server of its own, so the suite's are untouched.

Redis: agent connections stay open through the outage, their events are stored and acked
meanwhile (they need only the database), and once Redis is back each connection joins its
node's group again, so work asked for during the outage reaches the agent.

PostgreSQL: agent connections stay open too; what arrives meanwhile is answered server_error
and sent again by the agent until it is stored, and a hello is answered the same way, so an
agent that comes during the outage is welcomed once the database is back."""

import subprocess
import sys
import time

import pytest

from clusters.tests.factories import ClusterFactory
from healthchecks.models import CheckRun, HealthEvent
from healthchecks.services import do_request_check
from nodes.models import Node
from nodes.services import do_issue_join_token

from .browser import free_port
from .integration import Postgres, Process, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


class Redis(Process):
    """A throwaway redis-server on a fixed port, without persistence: a restart forgets
    everything (the channel layer's groups, the publisher's lease), as a real one can."""

    def __init__(self, processes):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        super().__init__("redis", ["redis-server", "--bind", "127.0.0.1", "--port", self.port,
                                   "--save", "", "--appendonly", "no"],
                         env=processes.env, log_path=processes.directory / "redis.log")
        processes.processes.append(self)


def test_a_redis_restart_drops_no_agent_connection_and_loses_no_event_or_work(processes):
    redis = Redis(processes).start().wait_listening()
    processes.env.update(REDIS_URL=redis.url, CLUSTERUI_BOOT_WINDOW_S="0")
    cluster = ClusterFactory(name="int-redis", slug="int-redis")
    _, join_token = do_issue_join_token(cluster)
    server = processes.daphne()
    # The Xid comes 20 s after the agent starts: while Redis is away (killed once the agent
    # is connected, with room for a slow machine).
    agent = processes.agent("gpu-blip", server, token=join_token, inject="xid:79@20s")
    node = wait_until(lambda: agent.check_running() or Node.objects.filter(
        cluster=cluster, name="gpu-blip", last_hello_at__isnull=False).first(),
        timeout=30, what="gpu-blip says hello")
    # The agent logs its connection once welcomed, a moment after the server stored the hello.
    wait_until(lambda: agent.connections_opened() >= 1, timeout=10,
               what="the agent logs its connection")
    assert agent.connections_opened() == 1

    redis.kill()
    lost_at = time.time()
    run, _ = do_request_check(node, "nvml_sanity")  # its offer cannot go out now
    event = wait_until(lambda: HealthEvent.objects.filter(node=node, signature="xid:79").first(),
                       timeout=40, what="the Xid is stored while Redis is away")
    assert event.first_seen.timestamp() > lost_at
    wait_until(lambda: agent.outbox_ids() == [], timeout=10,
               what="the Xid is acked while Redis is away")
    assert CheckRun.objects.get(pk=run.pk).status == CheckRun.Status.QUEUED
    server.check_running()

    redis.start().wait_listening()
    back_at = time.time()
    wait_until(lambda: CheckRun.objects.get(pk=run.pk).status == CheckRun.Status.PASSED,
               timeout=20, what="the check asked for during the outage reaches the agent")
    print(f"the check reached the agent and passed {time.time() - back_at:.1f} s after "
          f"Redis came back")
    # One connection all along: the outage dropped nothing.
    assert agent.connections_opened() == 1
    assert "WSDISCONNECT" not in server.log_text()


def manage(env, *argv):
    """`manage.py` with `env`; its stdout."""
    return subprocess.run([sys.executable, "manage.py", *argv], env=env, check=True,
                          capture_output=True, text=True, timeout=300).stdout


def stored_events(postgres):
    """{signature: (count, number of rows)} of the health events in `postgres`."""
    with postgres.connect("clusterui") as db:
        rows = db.execute("SELECT signature, sum(count), count(*) FROM healthchecks_healthevent "
                          "GROUP BY signature").fetchall()
    return {signature: (int(total), rows) for signature, total, rows in rows}


def welcomed(postgres, name):
    with postgres.connect("clusterui") as db:
        return db.execute("SELECT last_hello_at FROM nodes_node WHERE name = %s",
                          [name]).fetchone()


@pytest.fixture
def postgres(processes):
    """A PostgreSQL of the test's own, with clusterui's tables, a cluster `int-pg` and a
    join token for it; stopped and removed after the test."""
    server = Postgres("postgresql", env=processes.env,
                      log_path=processes.directory / "postgresql.log")
    processes.processes.append(server)
    server.start().wait_ready()
    with server.connect() as db:
        db.execute("CREATE DATABASE clusterui")
    processes.env.update(DATABASE_URL=server.url("clusterui"))
    manage(processes.env, "migrate", "--no-input")
    manage(processes.env, "shell", "-c", "from clusters.models import Cluster; "
           "Cluster.objects.create(name='int-pg', slug='int-pg')")
    server.join_token = manage(processes.env, "jointoken", "--cluster", "int-pg").strip()
    try:
        yield server
    finally:
        server.remove()


def test_a_postgresql_restart_drops_no_agent_connection_and_loses_no_event(processes,
                                                                           postgres):
    redis = Redis(processes).start().wait_listening()
    processes.env.update(REDIS_URL=redis.url, CLUSTERUI_BOOT_WINDOW_S="0")
    server = processes.daphne()
    # One Xid before the outage, two while the database is away (it stops once the first is
    # stored, and is away for 12 s or more), one after it.
    agent = processes.agent("gpu-pg", server, token=postgres.join_token,
                            inject="xid:79@4s:gpu0,xid:48@15s:gpu1,xid:63@18s:gpu2,"
                                   "xid:94@40s:gpu3")
    wait_until(lambda: agent.check_running() or "xid:79" in stored_events(postgres),
               timeout=40, what="the first Xid is stored")

    postgres.stop()
    down_at = time.time()
    late = processes.agent("gpu-late", server, token=postgres.join_token)
    wait_until(lambda: agent.log_text().count("the server asks for event") >= 2, timeout=30,
               what="the Xids sent while the database is away are answered server_error")
    wait_until(lambda: "the server could not take the hello" in late.log_text(), timeout=20,
               what="the hello of an agent that comes during the outage is answered "
                    "server_error")
    time.sleep(max(0.0, down_at + 12 - time.time()))
    server.check_running()

    postgres.start().wait_ready()
    back_at = time.time()
    wait_until(lambda: {"xid:48", "xid:63"} <= stored_events(postgres).keys(), timeout=20,
               what="the Xids sent during the outage are stored once it is over")
    stored_after = time.time() - back_at
    wait_until(lambda: welcomed(postgres, "gpu-late"), timeout=20,
               what="the agent that came during the outage is welcomed")
    welcomed_after = time.time() - back_at
    wait_until(lambda: "xid:94" in stored_events(postgres), timeout=60,
               what="the Xid after the outage is stored")
    wait_until(lambda: agent.outbox_ids() == [], timeout=10, what="every Xid is acked")
    print(f"database back: the outage's Xids stored after {stored_after:.1f} s, the late "
          f"agent welcomed after {welcomed_after:.1f} s")

    # Each stored once, on the one connection the agent had all along; no node lost.
    events = stored_events(postgres)
    assert {signature: events[signature] for signature in
            ("xid:79", "xid:48", "xid:63", "xid:94")} == {
        "xid:79": (1, 1), "xid:48": (1, 1), "xid:63": (1, 1), "xid:94": (1, 1)}
    assert "heartbeat_lost" not in events
    assert agent.connections_opened() == 1
    assert late.connections_opened() == 1
