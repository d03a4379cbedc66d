import pytest
from django.urls import reverse

from clusters.models import AuditEntry, Cluster

pytestmark = pytest.mark.django_db

NEW_CLUSTER = {
    "slug": "prod-b200", "name": "prod-b200", "region": "eu-north-1", "gpu_type": "NVIDIA B200",
    "gpus_per_node": 8, "driver_version": "580.95.05", "networking": "RoCE 400G",
    "os_image": "Ubuntu 24.04", "billing_rate_per_gpu_hour": "3.25", "scheduler": "none",
    "degraded_threshold_pct": 10, "planned_nodes": 4, "step": "create",
}


def settings_url(cluster):
    return reverse("clusterui:cluster_settings", args=[cluster.slug])


def test_the_list_shows_each_cluster_with_its_counts(client_for, viewer, cluster):
    from nodes.tests.factories import NodeFactory

    NodeFactory.create_batch(2, cluster=cluster, state="unhealthy")
    response = client_for(viewer).get(reverse("clusterui:cluster_list"))
    (row,) = response.context["clusters"]
    assert (row.node_count, row.unhealthy, row.healthy) == (2, 2, 0)
    assert "New cluster" not in response.text


def test_an_admin_creates_a_cluster_and_it_is_audited(client_for, admin):
    response = client_for(admin).post(reverse("clusterui:cluster_create"), NEW_CLUSTER)

    cluster = Cluster.objects.get(slug="prod-b200")
    assert response.status_code == 302 and response["Location"] == cluster.get_absolute_url()
    assert cluster.created_by == admin
    entry = AuditEntry.objects.get(action="cluster.create")
    assert entry.actor == admin and entry.object_id == str(cluster.pk)
    assert entry.changes["after"]["billing_rate_per_gpu_hour"] == "3.2500"
    assert entry.changes["after"]["scheduler"] == "none"  # the scheduler is the cluster's


def test_an_invalid_cluster_is_refused_with_the_reason(client_for, admin, cluster):
    response = client_for(admin).post(
        reverse("clusterui:cluster_create"),
        {**NEW_CLUSTER, "slug": cluster.slug, "billing_rate_per_gpu_hour": "-1"},
    )
    assert response.status_code == 400
    assert "Cluster with this Slug already exists." in response.text
    assert "greater than or equal to 0" in response.text
    assert not AuditEntry.objects.exists()


@pytest.mark.parametrize("persona", ["viewer", "operator", "outsider"])
def test_only_admins_create_clusters(client_for, persona, request):
    client = client_for(request.getfixturevalue(persona))
    assert client.get(reverse("clusterui:cluster_create")).status_code == 403
    assert client.post(reverse("clusterui:cluster_create"), NEW_CLUSTER).status_code == 403
    assert not Cluster.objects.filter(slug="prod-b200").exists()


def test_create_answers_only_get_and_post(client_for, admin):
    assert client_for(admin).put(reverse("clusterui:cluster_create")).status_code == 405


def test_everyone_with_a_role_reads_the_settings(client_for, viewer, cluster):
    response = client_for(viewer).get(settings_url(cluster))
    assert response.status_code == 200
    assert "InfiniBand NDR 400 Gb/s" in response.text
    assert "<form" not in response.text.split("<main>")[1]


def test_an_admin_edits_settings_and_each_change_is_recorded(client_for, admin, cluster):
    data = {f: getattr(cluster, f) for f in Cluster.CONFIGURATION_FIELDS}
    data.update(driver_version="580.95.05", acceptance_tests_enabled="on")

    response = client_for(admin).post(settings_url(cluster), data)

    assert response.status_code == 302
    cluster.refresh_from_db()
    assert cluster.driver_version == "580.95.05" and cluster.acceptance_tests_enabled
    entry = AuditEntry.objects.get(action="cluster.update")
    assert entry.actor_name == "ada"
    assert entry.changes == {
        "driver_version": {"before": "580.159.04", "after": "580.95.05"},
        "acceptance_tests_enabled": {"before": False, "after": True},
    }


def test_saving_unchanged_settings_records_nothing(client_for, admin, cluster):
    data = {f: getattr(cluster, f) for f in Cluster.CONFIGURATION_FIELDS}
    data.pop("acceptance_tests_enabled")
    client_for(admin).post(settings_url(cluster), data)
    assert not AuditEntry.objects.exists()


@pytest.mark.parametrize("persona", ["viewer", "operator"])
def test_only_admins_change_settings(client_for, persona, request, cluster):
    response = client_for(request.getfixturevalue(persona)).post(
        settings_url(cluster), {"name": "renamed", "gpus_per_node": 8,
                                "billing_rate_per_gpu_hour": "0"})
    assert response.status_code == 403
    cluster.refresh_from_db()
    assert cluster.name == "prod-h200"


def test_role_groups_hold_their_permissions(viewer, operator, admin):
    from clusters.roles import Role, has_role

    assert viewer.has_perm("clusterui.view_cluster") and not viewer.has_perm(
        "clusterui.operate_cluster")
    assert operator.has_perm("clusterui.operate_cluster") and not operator.has_perm(
        "clusterui.administer_cluster")
    assert admin.has_perm("clusterui.administer_cluster") and admin.has_perm("nodes.view_node")
    assert has_role(admin, Role.OPERATOR) and not has_role(viewer, Role.OPERATOR)


def test_audit_entries_are_append_only(admin, cluster):
    from clusters.services import record_audit

    entry = record_audit(admin, "cluster.update", cluster)
    with pytest.raises(ValueError):
        entry.save()
    with pytest.raises(ValueError):
        entry.delete()


def test_an_admin_makes_a_join_token_and_sees_it_once(client_for, admin, cluster):
    from nodes.services import find_usable_token

    client = client_for(admin)
    response = client.post(reverse("clusterui:join_token_create", args=[cluster.slug]),
                           {"note": "rack 12", "expires_in_hours": "48"})

    assert response.status_code == 200
    plaintext = response.context["new_join_token"]
    token = find_usable_token(plaintext)
    assert token.cluster == cluster and token.note == "rack 12" and token.expires_at
    assert plaintext in response.text
    assert plaintext not in client.get(settings_url(cluster)).text  # shown once
    assert AuditEntry.objects.get(action="jointoken.create").actor == admin


def test_an_admin_revokes_a_join_token(client_for, admin, cluster):
    from nodes.services import do_issue_join_token, find_usable_token

    token, plaintext = do_issue_join_token(cluster)
    url = reverse("clusterui:join_token_revoke", args=[cluster.slug, token.public_id])
    response = client_for(admin).post(url)
    assert response.status_code == 302
    assert find_usable_token(plaintext) is None
    assert AuditEntry.objects.get(action="jointoken.revoke").actor == admin
    assert client_for(admin).get(url).status_code == 405


def test_a_bad_token_request_says_why(client_for, admin, cluster):
    response = client_for(admin).post(
        reverse("clusterui:join_token_create", args=[cluster.slug]), {"expires_in_hours": "-3"})
    assert response.status_code == 400
    assert "greater than or equal to 1" in response.text


@pytest.mark.parametrize("persona", ["viewer", "operator"])
def test_only_admins_handle_join_tokens(client_for, persona, request, cluster):
    from nodes.services import do_issue_join_token

    token, _ = do_issue_join_token(cluster)
    client = client_for(request.getfixturevalue(persona))
    assert client.post(reverse("clusterui:join_token_create",
                               args=[cluster.slug])).status_code == 403
    assert client.post(reverse("clusterui:join_token_revoke",
                               args=[cluster.slug, token.public_id])).status_code == 403
    assert "Join tokens" not in client.get(settings_url(cluster)).text


def test_the_settings_page_explains_the_acceptance_tests_trade_off(client_for, admin, cluster):
    page = client_for(admin).get(reverse("clusterui:cluster_settings", args=[cluster.slug])).text
    assert "stays pending, taking no work, until its agent passes" in page
    assert "Recommended for multi-GPU training and long-running clusters" in page
