"""The creation page (overview/creation.py): every section, the review and its checks, and one
audited creation."""

import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.urls import reverse
from django.utils import timezone

from clusters.models import AuditEntry, Cluster, KubernetesAccess
from nodes.models import MaintenanceWindow
from schedulers.tests.kubernetes_fake import fake_api, write_kubeconfig  # noqa: F401 (fixture)
from startup.models import StartupScript

pytestmark = pytest.mark.django_db

URL = "/clusters/new/"
CHOICES = {
    "slug": "train-h200", "name": "train-h200", "region": "us-east-1", "gpu_type": "NVIDIA H200",
    "gpus_per_node": 8, "planned_nodes": 32, "billing_rate_per_gpu_hour": "2.10",
    "scheduler": "none", "degraded_threshold_pct": 10, "acceptance_tests_enabled": "on",
    "acceptance_checks": ["nvml_sanity", "gpu_compute", "nccl"],
    "startup_scripts": ["scratch-prep", "monitoring-agent", "slack-job-end"],
    "ssh_command_template": "ssh {user}@{node}",
}


@pytest.fixture
def issuer():
    """An OpenID Connect discovery document on loopback: `issuer.document` is what it serves."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path != "/.well-known/openid-configuration":
                self.send_error(404)
                return
            body = json.dumps(server.document).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    server.document = {"issuer": server.url, "jwks_uri": f"{server.url}/jwks",
                       "authorization_endpoint": f"{server.url}/auth"}
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


def test_the_page_has_every_section_and_the_trade_off(client_for, admin):
    text = client_for(admin).get(URL).content.decode()
    for section in ("configuration", "scheduler", "acceptance", "kubernetes-oidc",
                    "startup-scripts", "the-rest"):
        assert f'id="section-{section}"' in text
    assert "epoch 47" in text and "short bursts" in text
    assert "Slack message at job end" in text


def test_the_review_shows_every_choice_and_saves_nothing(client_for, admin):
    response = client_for(admin).post(URL, {**CHOICES, "step": "review"})
    assert response.status_code == 200
    text = response.content.decode()
    assert "Review: train-h200" in text
    assert "256 GPUs in all" in text
    assert "Recommended on: 256 GPUs" in text
    assert "NCCL all-reduce" in text and "no scheduler: nothing to reach" in text
    assert 'name="step" value="create"' in text
    assert not Cluster.objects.exists() and not AuditEntry.objects.exists()


def test_a_small_cluster_is_not_pressed_to_run_acceptance(client_for, admin):
    text = client_for(admin).post(URL, {**CHOICES, "planned_nodes": 2,
                                         "acceptance_tests_enabled": "", "step": "review"}).content
    assert b"Off is fine for this size" in text


def test_change_comes_back_to_the_page_with_every_choice(client_for, admin):
    response = client_for(admin).post(URL, {**CHOICES, "step": "edit"})
    form = response.context["form"]
    assert form.initial["acceptance_checks"] == ["nvml_sanity", "gpu_compute", "nccl"]
    assert form.initial["acceptance_tests_enabled"] is True
    assert b'value="train-h200"' in response.content


SLACK = "slack://T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7FQ"


def posted_channel_url(response):
    """The channel_url the page posts on (the review's hidden field, the page's own input)."""
    import re

    return re.search(r'name="channel_url" value="([^"]*)"', response.content.decode()).group(1)


def test_the_channel_url_is_a_secret_on_the_review(client_for, admin):
    from clusters.secret_store import value_of
    from notifications.models import Channel

    client = client_for(admin)
    review = client.post(URL, {**CHOICES, "channel_url": SLACK, "step": "review"})
    assert "slack://…" in review.content.decode()
    assert "TIiajkdnlazkcOXrIdevi7FQ" not in review.content.decode()
    sealed = posted_channel_url(review)
    assert sealed.startswith("sealed:")

    # "Change", then the review again: the page holds it sealed on the way, never in clear.
    change = client.post(URL, {**CHOICES, "channel_url": sealed, "step": "edit"})
    assert b"TIiajkdnlazkcOXrIdevi7FQ" not in change.content
    again = client.post(URL, {**CHOICES, "channel_url": posted_channel_url(change),
                              "step": "review"})
    assert again.status_code == 200 and b"TIiajkdnlazkcOXrIdevi7FQ" not in again.content

    client.post(URL, {**CHOICES, "channel_url": posted_channel_url(again), "step": "create"})
    assert value_of(Channel.objects.get(cluster__slug="train-h200").url_secret) == SLACK

    refused = client.post(URL, {**CHOICES, "channel_url": "nonsense://x", "step": "review"})
    assert refused.status_code == 400 and b"Apprise does not understand" in refused.content


def test_a_sealed_channel_url_that_was_changed_is_refused(client_for, admin):
    client = client_for(admin)
    sealed = posted_channel_url(client.post(URL, {**CHOICES, "channel_url": SLACK,
                                                  "step": "review"}))
    tampered = sealed[:-8] + ("A" if sealed[-8] != "A" else "B") + sealed[-7:]
    refused = client.post(URL, {**CHOICES, "channel_url": tampered, "step": "create"})
    assert refused.status_code == 400 and b"enter it again" in refused.content
    assert not Cluster.objects.exists()


def test_create_makes_everything_in_one_audited_action(client_for, admin):
    from notifications.models import Channel
    from nodes.queries import grafana_url
    from nodes.tests.factories import NodeFactory

    starts = (timezone.now() + timedelta(days=1)).replace(second=0, microsecond=0)
    response = client_for(admin).post(URL, {
        **CHOICES, "window_reason": "burn-in", "window_starts_at": starts.strftime("%Y-%m-%dT%H:%M"),
        "window_hours": 48, "channel_url": SLACK,
        "grafana_url_template": "https://grafana.example.com/d/dcgm?var-instance={node}",
        "step": "create"})

    cluster = Cluster.objects.get(slug="train-h200")
    assert response.status_code == 302
    assert cluster.acceptance_tests_enabled and cluster.acceptance_checks == "nvml_sanity gpu_compute nccl"
    assert cluster.status == Cluster.Status.PROVISIONING
    scripts = {(s.event, s.role): s.current_version.body for s in StartupScript.objects.filter(cluster=cluster)}
    assert set(scripts) == {("node_boot", "worker"), ("job_end", "worker")}
    assert "mount -o noatime" in scripts[("node_boot", "worker")]
    assert "node_exporter" in scripts[("node_boot", "worker")]  # two examples, one script
    window = MaintenanceWindow.objects.get(cluster=cluster)
    assert window.reason == "burn-in" and window.ends_at - window.starts_at == timedelta(hours=48)
    (entry,) = AuditEntry.objects.filter(action="cluster.create")
    assert entry.changes["planned_nodes"] == 32 and entry.changes["after"]["acceptance_checks"]
    channel = Channel.objects.get(cluster=cluster)
    assert channel.name == "slack alerts" and channel.url_hint == "slack://…"
    assert {rule.kind for rule in channel.rules.all()} >= {"repair_awaiting_approval",
                                                           "cluster_degraded"}
    assert "TIiajkdnlazkcOXrIdevi7FQ" not in str(list(AuditEntry.objects.values("changes")))
    node = NodeFactory(cluster=cluster, name="gpu-001")
    assert grafana_url(node) == "https://grafana.example.com/d/dcgm?var-instance=gpu-001"


def test_a_scheduler_it_cannot_reach_is_refused_on_review(client_for, admin, tmp_path):
    response = client_for(admin).post(URL, {
        **CHOICES, "scheduler": "kubernetes", "scheduler_config": str(tmp_path / "missing"),
        "oidc_issuer_url": "https://idp.invalid", "step": "create"})
    assert response.status_code == 400
    assert "could not reach it" in response.content.decode()
    assert not Cluster.objects.exists()


def test_kubernetes_oidc_is_checked_against_the_issuers_discovery_document(
        client_for, admin, fake_api, issuer, tmp_path):  # noqa: F811
    kubeconfig = write_kubeconfig(fake_api, tmp_path / "kubeconfig")
    choices = {**CHOICES, "scheduler": "kubernetes", "scheduler_config": str(kubeconfig),
               "oidc_issuer_url": issuer.url, "oidc_client_id": "kubectl",
               "oidc_groups_claim": "groups"}
    client = client_for(admin)

    issuer.document = {**issuer.document, "issuer": "https://elsewhere.example"}
    refused = client.post(URL, {**choices, "step": "review"})
    assert refused.status_code == 400 and "names another issuer" in refused.content.decode()

    issuer.document = {**issuer.document, "issuer": issuer.url}
    review = client.post(URL, {**choices, "step": "review"}).content.decode()
    assert f"--oidc-issuer-url={issuer.url}" in review
    assert "--oidc-client-id=kubectl" in review and "--oidc-groups-claim=groups" in review
    assert "the API server answered: 0 nodes" in review
    assert "kube-apiserver takes only https://" in review  # a loopback http issuer

    client.post(URL, {**choices, "step": "create"})
    access = KubernetesAccess.objects.get(cluster__slug="train-h200")
    assert (access.oidc_issuer_url, access.oidc_client_id, access.oidc_groups_claim) == (
        issuer.url, "kubectl", "groups")
    entry = AuditEntry.objects.get(action="cluster.create")
    assert entry.changes["kubernetes_oidc"]["oidc_issuer_url"] == issuer.url


def test_the_librarys_examples_pass_the_same_validation_as_a_save():
    from startup.library import EXAMPLES
    from startup.services import validate_body

    for example in EXAMPLES:
        validation = validate_body(example.body())
        assert not validation.syntax_error and not validation.warnings, example.key
