"""Redis restarting under a running deployment (issue 14, point 7): the test starts a Redis
of its own, so the suite's is untouched. Agent connections stay open through the outage,
their events are stored and acked meanwhile (they need only the database), and once Redis
is back each connection joins its node's group again, so work asked for during the outage
reaches the agent."""

import socket
import time

import pytest

from clusterui.tests.factories import ClusterFactory
from healthchecks.models import CheckRun, HealthEvent
from healthchecks.services import do_request_check
from nodes.models import Node
from nodes.services import do_issue_join_token

from .browser import free_port
from .integration import Process, wait_until

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

    def wait_listening(self):
        def listening():
            self.check_running()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return True
            except OSError:
                return False

        wait_until(listening, timeout=15, what="redis listens", interval=0.1)
        return self


def connections_opened(agent):
    return agent.log_text().count("connected to ws://")


def test_a_redis_restart_drops_no_agent_connection_and_loses_no_event_or_work(processes):
    redis = Redis(processes).start().wait_listening()
    processes.env.update(REDIS_URL=redis.url, CLUSTERUI_BOOT_WINDOW_S="0")
    cluster = ClusterFactory(name="int-redis", slug="int-redis")
    _, join_token = do_issue_join_token(cluster)
    server = processes.daphne()
    # The Xid comes 12 s after the agent starts: while Redis is away.
    agent = processes.agent("gpu-blip", server, token=join_token, inject="xid:79@12s")
    node = wait_until(lambda: agent.check_running() or Node.objects.filter(
        cluster=cluster, name="gpu-blip", last_hello_at__isnull=False).first(),
        timeout=30, what="gpu-blip says hello")
    assert connections_opened(agent) == 1

    redis.kill()
    lost_at = time.time()
    run, _ = do_request_check(node, "nvml_sanity")  # its offer cannot go out now
    event = wait_until(lambda: HealthEvent.objects.filter(node=node, signature="xid:79").first(),
                       timeout=30, what="the Xid is stored while Redis is away")
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
    assert connections_opened(agent) == 1
    assert "WSDISCONNECT" not in server.log_text()
