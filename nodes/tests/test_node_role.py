"""A node's role (worker, login, controller) picks its startup scripts. An admin sets it on the
node page or for several nodes from the Nodes list; the change is audited and the node's
connected agent gets its new role's scripts in a `config` frame at once."""


import pytest
from channels.db import database_sync_to_async
from django.urls import reverse

from clusters.models import AuditEntry
from common.groups import agent_group
from gateway.publisher import Publisher, read_feed_messages
from nodes.models import Node
from startup.services import Validation, config_frame_for, do_save_startup_script
from nodes.services import do_set_node_role
from gateway.tests.test_consumers import join, receive

from .factories import NodeFactory


pytestmark = pytest.mark.usefixtures("in_memory_channel_layer")


@pytest.fixture
def node(cluster):
    return NodeFactory(cluster=cluster, name="gpu-017")


def save_script(cluster, body, role, event="job_start"):
    return do_save_startup_script(cluster, event=event, role=role, body=body, timeout_s=30,
                                  validation=Validation())


def role_url(node):
    return reverse("nodes:set_role", args=[node.cluster.slug, node.name])


def bulk_role_url(cluster, query=""):
    return reverse("nodes:bulk_set_role", args=[cluster.slug]) + query


# The service


@pytest.mark.django_db
def test_a_new_role_is_audited_with_before_and_after(node, admin):
    changed = do_set_node_role(node, "login", actor=admin)

    assert changed is True and node.role == "login"
    assert Node.objects.get(pk=node.pk).role == "login"
    entry = AuditEntry.objects.get(action="node.set_role")
    assert (entry.actor, entry.object_type, entry.object_repr) == (admin, "nodes.node", "gpu-017")
    assert entry.cluster == node.cluster
    assert entry.changes == {"role": {"before": "worker", "after": "login"}}


@pytest.mark.django_db
def test_the_nodes_agent_is_told_its_config_changed(node, admin):
    do_set_node_role(node, "controller", actor=admin)

    # What the publisher sends once it reads the change feed.
    assert read_feed_messages() == [(agent_group(node.pk), {"type": "config.changed"})]


@pytest.mark.django_db
def test_the_same_role_again_changes_nothing_and_writes_no_entry(node, admin):
    changed = do_set_node_role(node, "worker", actor=admin)

    assert changed is False
    assert not AuditEntry.objects.exists()
    assert read_feed_messages() == []  # nothing sent to the agent


@pytest.mark.django_db
@pytest.mark.parametrize("role", ["", "Login", "gpu", None])
def test_an_unknown_role_is_refused_with_a_clear_error(node, admin, role):
    with pytest.raises(ValueError, match="unknown node role .*: one of worker, login, "
                                         "controller"):
        do_set_node_role(node, role, actor=admin)

    assert Node.objects.get(pk=node.pk).role == "worker"
    assert not AuditEntry.objects.exists()


@pytest.mark.django_db
def test_the_config_frame_then_carries_the_new_roles_scripts(cluster, node, admin):
    save_script(cluster, "echo worker\n", "worker")
    login = save_script(cluster, "echo login\n", "login")

    do_set_node_role(node, "login", actor=admin)

    assert config_frame_for(node.pk, 1.0)["startup_scripts"] == [
        {"id": login.script_id, "version": 1, "event": "job_start", "role": "login",
         "timeout_s": 30, "body": "echo login\n"}]


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_connected_agent_gets_its_new_roles_scripts_at_once(cluster, join_token, admin):
    await database_sync_to_async(save_script)(cluster, "echo worker\n", "worker")
    await database_sync_to_async(save_script)(cluster, "echo controller\n", "controller")
    communicator, _ = await join(join_token)  # its first config: the worker's scripts
    node = await database_sync_to_async(Node.objects.select_related("cluster").get)(
        name="gpu-001")

    await database_sync_to_async(do_set_node_role)(node, "controller", actor=admin)
    await Publisher().push_changes()  # the change feed tells the connection

    config = await receive(communicator)
    while config["type"] != "config":
        config = await receive(communicator)
    assert [(s["role"], s["body"]) for s in config["startup_scripts"]] == [
        ("controller", "echo controller\n")]
    await communicator.disconnect()


# The node page


@pytest.mark.django_db
def test_an_admin_sets_the_role_on_the_node_page(client_for, admin, node):
    response = client_for(admin).post(role_url(node), {"role": "login"}, follow=True)

    assert response.redirect_chain == [("/c/prod-h200/nodes/gpu-017/", 302)]
    assert "gpu-017 is now a login node: it runs the login startup scripts." in response.text
    assert '<option value="login" selected>login</option>' in response.text
    assert Node.objects.get(pk=node.pk).role == "login"
    entry = AuditEntry.objects.get(action="node.set_role")
    assert entry.actor_name == "ada" and entry.source_ip == "127.0.0.1"


@pytest.mark.django_db
def test_the_same_role_again_says_so(client_for, admin, node):
    response = client_for(admin).post(role_url(node), {"role": "worker"}, follow=True)
    assert "gpu-017 was already a worker node." in response.text
    assert not AuditEntry.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("data, error", [
    ({"role": "gpu"}, "gpu is not a role: pick worker, login or controller."),
    ({}, "Pick a role."),
])
def test_a_bad_role_is_a_form_error_not_a_server_error(client_for, admin, node, data, error):
    response = client_for(admin).post(role_url(node), data, follow=True)

    assert response.status_code == 200
    assert f"gpu-017: role not changed. {error}" in response.text
    assert Node.objects.get(pk=node.pk).role == "worker"
    assert not AuditEntry.objects.exists()


@pytest.mark.django_db
def test_an_htmx_post_returns_only_the_role_and_the_message(client_for, admin, node):
    response = client_for(admin).post(role_url(node), {"role": "controller"},
                                      HTTP_HX_REQUEST="true")

    text = response.text.lstrip()
    assert response.status_code == 200
    assert text.startswith('<dd id="node-role" class="inline-form">')
    assert "<strong>controller</strong>" in text
    assert '<div id="messages" class="messages" role="status" hx-swap-oob="true">' in text
    assert "gpu-017 is now a controller node" in text
    assert "<h1>" not in text


@pytest.mark.django_db
def test_an_htmx_post_with_a_bad_role_shows_the_error_in_the_fragment(client_for, admin, node):
    response = client_for(admin).post(role_url(node), {"role": "gpu"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert "role not changed. gpu is not a role" in response.text
    assert "<strong>worker</strong>" in response.text


@pytest.mark.django_db
@pytest.mark.parametrize("persona", ["operator", "viewer", "outsider"])
def test_only_an_admin_may_set_the_role(client_for, node, persona, request):
    user = request.getfixturevalue(persona)
    response = client_for(user).post(role_url(node), {"role": "login"})
    assert response.status_code == 403
    assert Node.objects.get(pk=node.pk).role == "worker"


@pytest.mark.django_db
def test_get_is_not_allowed(client_for, admin, node):
    assert client_for(admin).get(role_url(node)).status_code == 405


@pytest.mark.django_db
def test_a_node_not_in_the_cluster_is_404(client_for, admin, cluster):
    stranger = NodeFactory(name="elsewhere")  # in another cluster
    url = reverse("nodes:set_role", args=[cluster.slug, stranger.name])
    assert client_for(admin).post(url, {"role": "login"}).status_code == 404
    assert Node.objects.get(pk=stranger.pk).role == "worker"


@pytest.mark.django_db
def test_the_node_page_shows_the_role_and_only_an_admin_gets_the_form(
        client_for, admin, operator, viewer, node):
    Node.objects.filter(pk=node.pk).update(role="login")
    url = node.get_absolute_url()

    as_admin = client_for(admin).get(url).text
    assert f'action="{role_url(node)}"' in as_admin
    assert '<option value="login" selected>login</option>' in as_admin
    for user in (operator, viewer):
        page = client_for(user).get(url).text
        assert "<dt>Role</dt>" in page and "<strong>login</strong>" in page
        assert role_url(node) not in page


# The Nodes list's bulk form


@pytest.fixture
def nodes(cluster):
    return [NodeFactory(cluster=cluster, name=f"gpu-{i:03d}") for i in range(1, 6)]


@pytest.mark.django_db
def test_an_admin_sets_the_role_of_several_nodes(client_for, admin, cluster, nodes):
    Node.objects.filter(pk=nodes[0].pk).update(role="login")

    response = client_for(admin).post(
        bulk_role_url(cluster, "?state=healthy"),
        {"nodes": [n.name for n in nodes[:3]], "role": "login"}, follow=True)

    assert response.redirect_chain == [("/c/prod-h200/nodes/?state=healthy", 302)]
    assert "Set the role to login on 2 nodes; 1 was already login." in response.text
    assert sorted(Node.objects.filter(role="login").values_list("name", flat=True)) == [
        "gpu-001", "gpu-002", "gpu-003"]
    entries = AuditEntry.objects.filter(action="node.set_role")
    assert sorted(entries.values_list("object_repr", flat=True)) == ["gpu-002", "gpu-003"]
    assert read_feed_messages() == [(agent_group(node.pk), {"type": "config.changed"})
                                    for node in nodes[1:3]]


@pytest.mark.django_db
def test_a_bulk_role_needs_a_known_role(client_for, admin, cluster, nodes):
    response = client_for(admin).post(bulk_role_url(cluster),
                                      {"nodes": [nodes[0].name], "role": "gpu"}, follow=True)
    assert "gpu is not a role: pick worker, login or controller." in response.text
    assert not Node.objects.exclude(role="worker").exists()


@pytest.mark.django_db
def test_an_htmx_bulk_role_returns_the_table_and_the_message(client_for, admin, cluster, nodes):
    response = client_for(admin).post(bulk_role_url(cluster),
                                      {"nodes": [nodes[0].name], "role": "controller"},
                                      HTTP_HX_REQUEST="true")
    text = response.text.lstrip()
    assert text.startswith('<div id="node-table"')
    assert "Set the role to controller on 1 node." in text


@pytest.mark.django_db
def test_an_operator_may_not_set_roles_in_bulk_nor_sees_the_button(client_for, operator, admin,
                                                                   cluster, nodes):
    response = client_for(operator).post(bulk_role_url(cluster),
                                         {"nodes": [nodes[0].name], "role": "login"})
    assert response.status_code == 403
    assert not Node.objects.exclude(role="worker").exists()
    list_url = reverse("nodes:list", args=[cluster.slug])
    assert bulk_role_url(cluster) not in client_for(operator).get(list_url).text
    assert bulk_role_url(cluster) in client_for(admin).get(list_url).text


@pytest.mark.django_db
def test_get_of_the_bulk_role_is_not_allowed(client_for, admin, cluster):
    assert client_for(admin).get(bulk_role_url(cluster)).status_code == 405
