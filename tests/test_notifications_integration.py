"""Issue 16's path over real processes: daphne, the real agent injecting Xid 79, a Celery
worker and beat. The fault -> a reboot recommendation -> exactly one grouped, signed message
at a receiver on loopback -> its link opens the recommendation with its Approve button -> a
viewer's API token is refused (403, audited) -> an operator's approves through the API ->
the node reboots -> a resolved message."""

import json
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import pytest
from django.test import Client
from standardwebhooks import Webhook

from api.tokens import do_create_api_token
from clusters.models import AuditEntry
from clusters.roles import Role
from clusters.tests.factories import ClusterFactory, UserFactory
from nodes.services import do_issue_join_token
from notifications.models import Channel
from notifications.services import do_create_channel
from notifications.tests.receivers import HttpReceiver
from repairs.choices import Status
from repairs.models import Repair, RepairSettings

from .integration import wait_until
from .test_live_integration import joined_node

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def receiver():
    receiver = HttpReceiver().start()
    yield receiver
    receiver.stop()


def api_post(url, token, body):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {token}",
                                              "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def messages_of(receiver, key):
    return [(headers, body) for _, headers, body in receiver.requests
            if Webhook(key).verify(body, headers)["data"]["group"] == "repair_awaiting_approval"]


def test_an_xid_79_is_one_message_whose_link_leads_to_an_api_approval_and_a_reboot(
        processes, receiver):
    processes.env.update(CLUSTERUI_BOOT_WINDOW_S="0")
    cluster = ClusterFactory(name="int-notify", slug="int-notify")
    RepairSettings.objects.create(cluster=cluster, provider="simulated")
    admin = UserFactory(username="int-ada", role=Role.ADMIN)
    channel, key = do_create_channel(cluster, name="automation", kind="webhook",
                                     url=receiver.url(), actor=admin, group_wait_s=2,
                                     rules=[{"kind": "repair_awaiting_approval"}])
    Channel.objects.filter(pk=channel.pk).update(group_interval_s=2)  # the form's minimum is 10
    _, join_token = do_issue_join_token(cluster)
    server = processes.daphne()
    processes.env.update(CLUSTERUI_PUBLIC_URL=server.url)
    worker = processes.celery("worker", "--concurrency=1", "-P", "solo", "--without-heartbeat",
                              "--without-gossip", "--without-mingle")
    processes.celery("beat", "-s", processes.directory / "beat-schedule", "--max-interval", "1")
    agent = processes.agent("gpu-001", server, token=join_token, inject="xid:79@3s:gpu3",
                            extra_args=["--simulated-boot", "2"])
    node = joined_node(cluster, "gpu-001", agent=agent)

    def firing():
        worker.check_running()
        return messages_of(receiver, key)

    [(headers, body)] = wait_until(firing, timeout=60, what="the recommendation's message")
    payload = Webhook(key).verify(body, headers)
    [alert] = payload["data"]["firing"]
    repair = Repair.objects.get(node=node, status=Status.PROPOSED)
    assert alert["node"] == "gpu-001" and alert["signature"] == "xid:79"
    assert alert["url"] == server.url + repair.get_absolute_url()

    operator = UserFactory(username="int-otto", role=Role.OPERATOR)
    browser = Client()
    browser.force_login(operator)
    page = browser.get(urlsplit(alert["url"]).path)
    assert page.status_code == 200
    assert b"Approve" in page.content and str(repair.public_id).encode() in page.content

    approve = f"{server.url}/api/v1/clusters/{cluster.slug}/repairs/{repair.pk}/approve/"
    viewer = UserFactory(username="int-vera", role=Role.VIEWER)
    _, viewer_token = do_create_api_token(viewer, name="bot", expires_in_days=1)
    status, problem = api_post(approve, viewer_token, {"comment": "me too"})
    assert status == 403 and "needs the operator role" in problem["detail"]
    assert AuditEntry.objects.filter(action="api.forbidden", actor=viewer).count() == 1
    _, operator_token = do_create_api_token(operator, name="pager", expires_in_days=1)
    status, answer = api_post(approve, operator_token, {"comment": "from the message"})
    assert status == 200 and answer["reviewed_by"] == "int-otto"
    wait_until(lambda: Repair.objects.filter(pk=repair.pk, status=Status.SUCCEEDED).exists(),
               timeout=120, what="the reboot")

    def resolved():
        worker.check_running()
        sent = messages_of(receiver, key)
        return sent if len(sent) == 2 else None

    sent = wait_until(resolved, timeout=30, what="the resolved message")
    resolved_payload = Webhook(key).verify(sent[1][1], sent[1][0])
    assert resolved_payload["type"] == "alert.resolved"
    assert [a["id"] for a in resolved_payload["data"]["resolved"]] == [alert["id"]]
    assert len(messages_of(receiver, key)) == 2  # one message each: nothing twice
