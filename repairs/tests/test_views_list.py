"""The Repair tab: awaiting approval (evidence, the node's history, the jobs on it, approve /
reject), running (waiting reason, steps), history (filters, pages), and its fragments."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from clusters.models import Cluster
from healthchecks.services import do_record_health_event
from nodes.tests.factories import GpuFactory, NodeFactory
from repairs.choices import Action, Status, StepKind, StepStatus
from schedulers import ExecutorError, Job
from repairs.models import RepairStep
from repairs.services import refresh_recommendation, settings_for
from repairs.tests.factories import RepairFactory

pytestmark = pytest.mark.django_db

KERNEL_LINE = "NVRM: Xid (PCI:0000:09:00): 79, pid='<unknown>', GPU has fallen off the bus."


@pytest.fixture
def url(cluster):
    return reverse("repairs:list", args=[cluster.slug])


def recommend(cluster, name, signature="xid:79"):
    """A node with an open event of `signature` on its GPU 3, and the system's recommendation."""
    node = NodeFactory(cluster=cluster, name=name)
    gpu = GpuFactory(node=node, index=3)
    do_record_health_event(node, signature=signature, severity="critical", gpu=gpu,
                           message="GPU has fallen off the bus",
                           evidence={"kernel_line": KERNEL_LINE})
    return refresh_recommendation(node)


def finished(node, status=Status.SUCCEEDED, *, action=Action.REBOOT, days_ago=1, **fields):
    at = timezone.now() - timedelta(days=days_ago)
    return RepairFactory(node=node, action=action, status=status, requested_at=at,
                         finished_at=at + timedelta(minutes=20), **fields)


def running(node, *, action=Action.REBOOT):
    repair = RepairFactory(node=node, action=action, status=Status.RUNNING,
                           started_at=timezone.now(), reviewed_at=timezone.now())
    RepairStep.objects.create(repair=repair, position=0, kind=StepKind.DRAIN,
                              status=StepStatus.DONE, attempts=1, message="drained (slurm)",
                              output="scontrol update nodename=gpu state=drain: ok")
    RepairStep.objects.create(repair=repair, position=1, kind=StepKind.ACT,
                              status=StepStatus.RUNNING, attempts=2,
                              message="reboot command sent to the agent")
    RepairStep.objects.create(repair=repair, position=2, kind=StepKind.WAIT_FOR_NODE)
    return repair


class FakeScheduler:
    """A scheduler as repairs.steps.scheduler_for hands it out: a Slurm cluster cannot run
    in these tests."""

    name = "slurm"

    def __init__(self, jobs=None, error=None):
        self.jobs = jobs or {}
        self.error = error
        self.asked = []

    def running_jobs(self, node_name):
        self.asked.append(node_name)
        if self.error:
            raise ExecutorError(self.error)
        return self.jobs.get(node_name, [])


def test_a_recommendation_shows_its_evidence_history_and_buttons(client_for, operator,
                                                                 cluster, url):
    repair = recommend(cluster, "gpu-017")
    earlier = finished(repair.node, outcome="healthy again after the reboot")
    finished(NodeFactory(cluster=cluster, name="gpu-099"))  # another node's: not its history

    response = client_for(operator).get(url)

    assert response.status_code == 200
    [card] = response.context["awaiting"]
    assert card.repair == repair and card.history == [earlier]
    section = response.text.split('id="repair-awaiting"')[1].split('id="repair-running"')[0]
    assert "gpu-017" in section and "GPU 3" in section and "xid:79" in section
    assert "reboot in place; local data is kept" in section
    assert "Why: NVIDIA: restart the machine (RESTART_BM)" in section
    assert "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS" in section
    assert "NVIDIA: restart the machine (RESTART_BM)" in section and "gpud: REBOOT_SYSTEM, HARDWARE_INSPECTION" in section
    assert "GPU has fallen off the bus." in section  # the kernel line
    assert f"#{earlier.pk} reboot" in section and "healthy again after the reboot" in section
    assert "gpu-099" not in section
    assert "No scheduler configured" in section
    assert ">Approve</button>" in section and ">Reject</button>" in section
    assert reverse("repairs:approve", args=[cluster.slug, repair.public_id]) in section


def test_viewers_see_no_buttons(client_for, viewer, cluster, url):
    recommend(cluster, "gpu-017")
    text = client_for(viewer).get(url).text
    assert "gpu-017" in text
    assert "Approve" not in text and "Reject" not in text and 'name="comment"' not in text


def test_a_signed_in_user_without_a_role_gets_403(client_for, outsider, url):
    assert client_for(outsider).get(url).status_code == 403


def test_the_jobs_on_the_node_come_from_the_scheduler(client_for, operator, cluster, url,
                                                      monkeypatch):
    recommend(cluster, "gpu-017")
    recommend(cluster, "gpu-018")
    scheduler = FakeScheduler({"gpu-017": [
        Job(id="48213", user="alice", name="llama-pretrain", gpus=64, run_time_s=7500)]})
    monkeypatch.setattr("repairs.queries.scheduler_for", lambda cluster: scheduler)

    text = client_for(operator).get(url).text

    assert sorted(scheduler.asked) == ["gpu-017", "gpu-018"]
    first, second = text.split('id="repair-awaiting"')[1].split("<article")[1:3]
    assert "48213" in first and "alice" in first and "llama-pretrain" in first
    assert ">64<" in first and ">133.3<" in first  # GPU-hours: 64 GPUs for 2 h 05 min
    assert "1 job stops on 1 node" in first
    assert "Blast radius: 1 of 2 nodes out of service after it; limit 10 % (1 node)" in first
    assert "No jobs running on gpu-018 (slurm" in second


def test_a_scheduler_that_does_not_answer_is_said_and_asked_once(client_for, operator,
                                                                  cluster, url, monkeypatch):
    recommend(cluster, "gpu-017")
    recommend(cluster, "gpu-018")
    scheduler = FakeScheduler(error="squeue: no answer within 15 s")
    monkeypatch.setattr("repairs.queries.scheduler_for", lambda cluster: scheduler)

    response = client_for(operator).get(url)

    assert response.status_code == 200
    assert response.text.count(
        "The scheduler could not be read: squeue: no answer within 15 s") == 2
    assert len(scheduler.asked) == 1  # each question would wait out its own time limit
    assert ">Approve</button>" in response.text
    assert response.text.count('name="confirm_unknown_jobs" required') == 2


def test_a_scheduler_that_cannot_be_reached_at_all_is_said(client_for, operator, cluster, url):
    Cluster.objects.filter(pk=cluster.pk).update(scheduler="kubernetes",
                                                 scheduler_config="/nonexistent/kubeconfig")
    recommend(cluster, "gpu-017")
    response = client_for(operator).get(url)
    assert response.status_code == 200
    assert ("The scheduler could not be read: cannot load the Kubernetes configuration"
            in response.text)


def test_running_repairs_show_their_steps_and_waiting_ones_why(client_for, viewer, cluster,
                                                               url):
    repair = running(NodeFactory(cluster=cluster, name="gpu-004"))
    RepairFactory(node=NodeFactory(cluster=cluster, name="gpu-005"), status=Status.WAITING,
                  reviewed_at=timezone.now(),
                  waiting_reason="1 of 10 nodes are out of service; the limit is 10 % (1 node)")

    text = client_for(viewer).get(url).text

    section = text.split('id="repair-running"')[1].split('id="repair-history"')[0]
    assert f"#{repair.pk} reboot" in section
    assert "drained (slurm)" in section and "1 attempt" in section
    assert "<details><summary>output</summary>" in section and "state=drain: ok" in section
    assert "reboot command sent to the agent" in section and "2 attempts" in section
    assert "wait for the node" in section
    assert "Waiting to start: 1 of 10 nodes are out of service" in section


def test_awaiting_comes_first_then_running_then_history(client_for, viewer, cluster, url):
    recommend(cluster, "gpu-017")
    running(NodeFactory(cluster=cluster, name="gpu-004"))
    finished(NodeFactory(cluster=cluster, name="gpu-001"))
    text = client_for(viewer).get(url).text
    positions = [text.index(f'id="{section}"') for section in
                 ("repair-awaiting", "repair-running", "repair-history")]
    assert positions == sorted(positions)


def test_empty_sections_say_what_would_appear(client_for, viewer, url):
    text = client_for(viewer).get(url).text
    assert "No repair awaits approval" in text
    assert "No repair is running" in text
    assert "No finished repairs yet" in text


def history(client, url, query=""):
    response = client.get(url + query)
    assert response.status_code == 200
    return sorted(r.node.name for r in response.context["history"])


def test_history_lists_finished_repairs_with_filters(client_for, viewer, cluster, url):
    a = NodeFactory(cluster=cluster, name="gpu-001")
    b = NodeFactory(cluster=cluster, name="gpu-002")
    finished(a, Status.SUCCEEDED, days_ago=1)
    finished(b, Status.FAILED, action=Action.REPROVISION, days_ago=3)
    finished(b, Status.REJECTED, days_ago=40)
    RepairFactory(node=NodeFactory(cluster=cluster, name="gpu-003"))  # open: not history
    finished(NodeFactory(name="gpu-777"))  # another cluster
    client = client_for(viewer)

    assert history(client, url) == ["gpu-001", "gpu-002", "gpu-002"]
    assert history(client, url, "?node=gpu-002") == ["gpu-002", "gpu-002"]
    assert history(client, url, "?action=reprovision") == ["gpu-002"]
    assert history(client, url, "?status=failed") == ["gpu-002"]
    assert history(client, url, "?status=rejected&node=gpu-001") == []
    assert history(client, url, "?period=24h") == ["gpu-001"]
    assert history(client, url, "?period=7d") == ["gpu-001", "gpu-002"]

    def at(days_ago):
        return (timezone.now() - timedelta(days=days_ago)).strftime("%Y-%m-%dT%H:%M")

    assert history(client, url, f"?since={at(50)}&until={at(30)}") == ["gpu-002"]
    assert history(client, url, f"?until={at(2)}") == ["gpu-002", "gpu-002"]


def test_a_window_that_ends_before_it_starts_is_refused(client_for, viewer, cluster, url):
    finished(NodeFactory(cluster=cluster))
    response = client_for(viewer).get(url + "?since=2026-01-02T00:00&until=2026-01-01T00:00")
    assert list(response.context["history"]) == []
    assert "must not be before since" in response.text


def test_history_pages_and_its_csv_link_keeps_the_filters(client_for, viewer, cluster, url):
    node = NodeFactory(cluster=cluster, name="gpu-001")
    for days_ago in range(55):
        finished(node, days_ago=days_ago + 1)
    client = client_for(viewer)
    first = client.get(url + "?node=gpu-001")
    assert len(first.context["history"]) == 50
    assert "page 1 of 2 (55 in all)" in first.text
    assert f'{reverse("repairs:history_csv", args=[cluster.slug])}?node=gpu-001' in first.text
    assert len(client.get(url + "?node=gpu-001&page=2").context["history"]) == 5


def test_an_htmx_request_gets_the_history_and_the_sections_out_of_band(client_for, viewer,
                                                                       cluster, url):
    recommend(cluster, "gpu-017")
    response = client_for(viewer).get(url + "?period=7d", HTTP_HX_REQUEST="true")
    text = response.text.strip()
    assert text.startswith('<div id="repair-history"')
    assert 'id="repair-awaiting"' in text and 'id="repair-running"' in text
    assert text.count('hx-swap-oob="true"') == 2
    assert "<html" not in text and 'class="filters"' not in text
    assert "HX-Request" in response["Vary"]

    page = client_for(viewer).get(url).text
    assert "js/repairs." in page  # js/repairs.<hash>.js under the manifest storage


# Session, user, role, cluster; the awaiting repairs, their events and steps, their nodes'
# earlier repairs; the running repairs, their events and steps; the history's count and
# rows; the blast radius (the cluster's repair settings, its node count, the nodes out of
# service); what was tried (the same GPUs by serial, their events and repairs, the nodes'
# signals). (Which scheduler to ask for the jobs is the cluster's: no query of its own.)
FRAGMENT_QUERIES = 20
PAGE_QUERIES = FRAGMENT_QUERIES + 1  # the page also lists the clusters for the switcher


@pytest.mark.parametrize("per_section", [1, 6])
def test_the_tabs_queries_do_not_grow_with_its_repairs(client_for, operator, cluster, url,
                                                       per_section, django_assert_num_queries):
    settings_for(cluster)
    for n in range(per_section):
        repair = recommend(cluster, f"gpu-1{n:02d}")
        finished(repair.node)
        finished(repair.node, Status.REJECTED, requested_by=operator, reviewed_by=operator)
        running(NodeFactory(cluster=cluster, name=f"gpu-2{n:02d}"))
    client = client_for(operator)

    with django_assert_num_queries(PAGE_QUERIES):
        response = client.get(url)
    assert len(response.context["awaiting"]) == per_section
    assert len(response.context["running"]) == per_section
    assert len(response.context["history"]) == 2 * per_section
    with django_assert_num_queries(FRAGMENT_QUERIES):
        client.get(url + "?period=7d", HTTP_HX_REQUEST="true")
