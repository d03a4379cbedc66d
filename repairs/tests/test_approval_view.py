"""What approving costs, recorded: the card's jobs (fresh within 30 s), the nodes they span
and the blast radius are kept with the approval; when the scheduler cannot be read,
approving needs a confirmation (page and API)."""

import pytest
from django.urls import reverse

from api.tests.conftest import ApiClient
from api.tokens import do_create_api_token
from clusters.models import AuditEntry
from repairs.choices import Status
from repairs.models import Repair
from repairs.queries import jobs_at_risk
from repairs.tests.test_views_list import FakeScheduler, recommend
from schedulers import Job

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_tasks")]

TRAINING = Job(id="48213", user="alice", name="llama-pretrain", gpus=24, run_time_s=7200,
               account="research", nodes=("gpu-016", "gpu-017", "gpu-018"))



def use(monkeypatch, scheduler):
    monkeypatch.setattr("repairs.queries.scheduler_for", lambda cluster: scheduler)
    return scheduler


def approve(client, repair, **data):
    return client.post(reverse("repairs:approve", args=[repair.cluster.slug, repair.public_id]),
                       data)


def test_approving_records_the_jobs_their_nodes_and_the_blast_radius(client_for, operator,
                                                                     cluster, monkeypatch):
    use(monkeypatch, FakeScheduler({"gpu-017": [TRAINING]}))
    repair = recommend(cluster, "gpu-017")
    approve(client_for(operator), repair, comment="checkpointed")
    repair.refresh_from_db()
    assert repair.status == Status.RUNNING
    assert repair.approval_view["jobs"] == [{
        "id": "48213", "user": "alice", "account": "research", "name": "llama-pretrain",
        "gpus": 24, "nodes": ["gpu-016", "gpu-017", "gpu-018"], "run_time_s": 7200,
        "gpu_hours": 48.0}]
    assert repair.approval_view["nodes_hit"] == ["gpu-016", "gpu-017", "gpu-018"]
    assert repair.approval_view["blast_radius"] == (
        "1 of 1 nodes out of service after it; limit 10 % (1 node)")
    page = client_for(operator).get(repair.get_absolute_url()).text
    assert "What alice saw when approving" in page and "gpu-016, gpu-017, gpu-018" in page


def test_the_scheduler_is_asked_at_most_every_30_seconds(cluster, monkeypatch):
    scheduler = use(monkeypatch, FakeScheduler({"gpu-017": [TRAINING]}))
    repair = recommend(cluster, "gpu-017")
    first = jobs_at_risk(cluster, [repair.node])[repair.node_id]
    again = jobs_at_risk(cluster, [repair.node])[repair.node_id]
    assert scheduler.asked == ["gpu-017"] and again == first


def test_an_unreadable_scheduler_needs_a_confirmation_to_approve(client_for, operator, cluster,
                                                                 monkeypatch):
    use(monkeypatch, FakeScheduler(error="scontrol: no answer within 5 s"))
    repair = recommend(cluster, "gpu-017")
    client = client_for(operator)
    approve(client, repair, comment="go")
    repair.refresh_from_db()
    assert repair.status == Status.PROPOSED
    approve(client, repair, comment="go", confirm_unknown_jobs="on")
    repair.refresh_from_db()
    assert repair.status == Status.RUNNING
    assert repair.approval_view["error"] == "scontrol: no answer within 5 s"
    entry = AuditEntry.objects.get(action="repair.approve")
    assert entry.changes == {"comment": "go",
                             "approved_without_knowing_the_jobs": "scontrol: no answer within 5 s"}


def test_rejecting_needs_no_confirmation_of_the_unknown_jobs(client_for, operator, cluster,
                                                            monkeypatch):
    use(monkeypatch, FakeScheduler(error="scontrol: no answer within 5 s"))
    repair = recommend(cluster, "gpu-017")
    page = client_for(operator).get(reverse("repairs:list", args=[cluster.slug])).text
    card = page.split(f'id="repair-{repair.public_id}"')[1].split("</article>")[0]
    assert 'name="confirm_unknown_jobs" required' in card
    assert card.count("formnovalidate") == 1  # Reject submits without it (Cancel: detail)


def test_the_refusal_says_why_on_the_page(client_for, operator, cluster, monkeypatch):
    use(monkeypatch, FakeScheduler(error="scontrol: no answer within 5 s"))
    repair = recommend(cluster, "gpu-017")
    page = client_for(operator).post(
        reverse("repairs:approve", args=[cluster.slug, repair.public_id]),
        {"next": reverse("repairs:list", args=[cluster.slug])}, follow=True).text
    assert "Not approved: the scheduler could not be read (scontrol: no answer within 5 s)" in page


def test_the_api_refuses_without_the_confirmation(operator, cluster, monkeypatch):
    use(monkeypatch, FakeScheduler(error="squeue: no answer within 15 s"))
    repair = recommend(cluster, "gpu-017")
    _, token = do_create_api_token(operator, name="tests", expires_in_days=1)
    client = ApiClient(token)
    url = reverse("api:approve_repair", args=[cluster.slug, repair.public_id])
    refused = client.post(url, {})
    assert refused.status_code == 409 and "could not be read" in refused.json()["detail"]
    answer = client.post(url, {"confirm_unknown_jobs": True})
    assert answer.status_code == 200
    assert answer.json()["approval_view"]["error"] == "squeue: no answer within 15 s"
    assert Repair.objects.get(pk=repair.pk).status == Status.RUNNING
