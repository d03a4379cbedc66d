"""The Kubernetes access page: each user's kubeconfig, the API server's OIDC flags and the
role bindings, checked with the official kubernetes client (its kubeconfig loader and its
RBAC models) rather than by reading the YAML back as text."""

import base64
import json

import pytest
import yaml
from django.urls import reverse
from kubernetes import client
from kubernetes.config.exec_provider import ExecProvider
from kubernetes.config.kube_config import KubeConfigLoader

from clusters import kubeaccess
from clusters.models import AuditEntry, Cluster, KubernetesAccess
from clusters.tests.factories import ClusterFactory
from repairs.models import RepairSettings

pytestmark = pytest.mark.django_db

ISSUER = "https://idp.example.com/realms/gpu"
CA_PEM = ("-----BEGIN CERTIFICATE-----\n"
          "MIIBdzCCAR2gAwIBAgIUKubernetesAccessTestCertificateOnly0wCgYIKoZIzj0EAwIw\n"
          "-----END CERTIFICATE-----\n")
CA_DATA = base64.b64encode(CA_PEM.encode()).decode()
ROLE_GROUPS = {"gpu-admins": "admin", "gpu-operators": "operator", "ml-oncall": "operator",
               "gpu-viewers": "viewer"}
FORM = {"api_server_url": "https://k8s.example.com:6443", "certificate_authority_data": CA_DATA,
        "oidc_client_id": "kubectl", "oidc_scopes": "groups", "username_claim": "email",
        "username_prefix": "oidc:", "groups_prefix": "idp:", "operator_namespaces": ""}


@pytest.fixture(autouse=True)
def oidc_settings(settings):
    settings.CLUSTERUI_OIDC_ISSUER = ISSUER
    settings.CLUSTERUI_OIDC_CLIENT_ID = "clusterui"
    settings.CLUSTERUI_OIDC_GROUPS_CLAIM = "groups"
    settings.CLUSTERUI_OIDC_ROLE_GROUPS = ",".join(
        f"{role}={';'.join(g for g, r in ROLE_GROUPS.items() if r == role)}"
        for role in sorted(set(ROLE_GROUPS.values())))
    return settings


@pytest.fixture
def k8s_cluster(db):
    return ClusterFactory(name="k8s-h200", slug="k8s-h200", scheduler="kubernetes")


@pytest.fixture
def access(k8s_cluster):
    return KubernetesAccess.objects.create(
        cluster=k8s_cluster, api_server_url="https://k8s.example.com:6443",
        certificate_authority_data=CA_DATA, oidc_client_id="kubectl",
        username_claim="email", username_prefix="oidc:", groups_prefix="idp:")


def page_url(cluster):
    return reverse("clusterui:kubernetes_access", args=[cluster.slug])


def download_url(cluster):
    return reverse("clusterui:kubeconfig_download", args=[cluster.slug])


class FakeResponse:
    """What ApiClient.deserialize reads from an API response: its body."""

    def __init__(self, document):
        self.data = json.dumps(document)


RBAC_MODELS = {"ClusterRoleBinding": "V1ClusterRoleBinding", "RoleBinding": "V1RoleBinding"}


def as_client_model(document):
    """The document as the kubernetes client's model; its required fields and types are
    checked on the way in, and what it gives back must be the whole document (a key the
    model does not know would be dropped)."""
    with client.ApiClient() as api:
        model = api.deserialize(FakeResponse(document), RBAC_MODELS[document["kind"]])
        assert api.sanitize_for_serialization(model) == document
    return model


def group(name):
    return client.RbacV1Subject(api_group="rbac.authorization.k8s.io", kind="Group", name=name)


def cluster_role(name):
    return client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=name)


class KubeloginNotRun(ExecProvider):
    """The exec plugin as the loader builds it (the real class checks apiVersion and
    command), without running kubectl oidc-login: it would open a browser at the IdP."""

    built = []

    def run(self, previous_response=None):
        KubeloginNotRun.built.append(self)
        return {"token": "id-token-from-kubelogin"}


# --- the page, per role ----------------------------------------------------------------

@pytest.mark.parametrize("persona", ["viewer", "operator"])
def test_every_role_sees_its_kubeconfig_flags_and_bindings_but_no_form(
        client_for, persona, access, request):
    user = request.getfixturevalue(persona)
    response = client_for(user).get(page_url(access.cluster))

    assert response.status_code == 200
    assert response.context["kubeconfig_yaml"] == kubeaccess.to_yaml(
        kubeaccess.kubeconfig(access, kubeaccess.oidc_facts(), user))
    assert "--oidc-issuer-url=https://idp.example.com/realms/gpu" in response.text
    assert "kind: AuthenticationConfiguration" in response.text
    assert "name: clusterui-operator" in response.text
    assert download_url(access.cluster) in response.text
    assert 'data-copy="kubeconfig-yaml"' in response.text and "js/copy." in response.text
    assert "<form" not in response.text.split("<main>")[1]
    assert "Only admins change these." in response.text


def test_the_page_tells_the_user_who_kubernetes_sees_and_which_role(client_for, operator,
                                                                    access):
    operator.email = "alice@example.com"
    operator.save()
    response = client_for(operator).get(page_url(access.cluster))
    assert response.context["your_username"] == "oidc:alice@example.com"
    assert response.context["your_kubernetes_role"] == "edit"


def test_an_admin_gets_the_form(client_for, admin, access):
    response = client_for(admin).get(page_url(access.cluster))
    assert response.status_code == 200
    assert 'name="api_server_url"' in response.text
    assert "Save Kubernetes access" in response.text


def test_an_outsider_is_refused(client_for, outsider, access):
    assert client_for(outsider).get(page_url(access.cluster)).status_code == 403
    assert client_for(outsider).get(download_url(access.cluster)).status_code == 403


def test_a_cluster_that_is_not_kubernetes_gets_a_page_that_says_so(client_for, viewer,
                                                                     cluster):
    Cluster.objects.filter(pk=cluster.pk).update(scheduler="slurm")
    response = client_for(viewer).get(page_url(cluster))
    assert response.status_code == 200
    assert "is not a Kubernetes cluster" in response.text
    assert "kubeconfig_yaml" not in response.context
    assert client_for(viewer).get(download_url(cluster)).status_code == 404


def test_a_cluster_without_repair_settings_is_not_kubernetes(client_for, admin, cluster):
    response = client_for(admin).post(page_url(cluster), FORM)
    assert response.status_code == 400
    assert "is not a Kubernetes cluster" in response.text
    assert not KubernetesAccess.objects.exists()


def test_the_settings_page_links_here_only_for_kubernetes_clusters(client_for, viewer,
                                                                     k8s_cluster, cluster):
    settings_page = client_for(viewer).get(
        reverse("clusterui:cluster_settings", args=[k8s_cluster.slug]))
    assert page_url(k8s_cluster) in settings_page.text
    other = client_for(viewer).get(reverse("clusterui:cluster_settings", args=[cluster.slug]))
    assert page_url(cluster) not in other.text


def test_without_oidc_settings_the_page_names_what_is_missing(client_for, viewer, access,
                                                              settings):
    del settings.CLUSTERUI_OIDC_ISSUER
    settings.CLUSTERUI_OIDC_ROLE_GROUPS = ""
    response = client_for(viewer).get(page_url(access.cluster))
    assert response.status_code == 200
    assert "OIDC sign-in is not configured" in response.text
    assert "CLUSTERUI_OIDC_ISSUER" in response.text
    assert "CLUSTERUI_OIDC_ROLE_GROUPS" in response.text
    assert "CLUSTERUI_OIDC_CLIENT_ID" not in response.text.split("Missing:")[1].split(".")[0]
    assert response.context["kubeconfig_yaml"] is None
    assert "--oidc-issuer-url" not in response.text
    assert client_for(viewer).get(download_url(access.cluster)).status_code == 404


def test_without_an_api_server_url_there_is_no_kubeconfig_yet(client_for, viewer, k8s_cluster):
    response = client_for(viewer).get(page_url(k8s_cluster))
    assert response.status_code == 200
    assert "an admin has not set the API server URL" in response.text
    assert "--oidc-client-id=clusterui" in response.text  # the console's client, by default
    assert client_for(viewer).get(download_url(k8s_cluster)).status_code == 404
    assert not KubernetesAccess.objects.exists()  # reading makes no row


# --- the admin's settings --------------------------------------------------------------

def test_an_admin_saves_the_settings_and_each_change_is_audited(client_for, admin, k8s_cluster):
    response = client_for(admin).post(page_url(k8s_cluster), FORM)

    assert response.status_code == 302 and response["Location"] == page_url(k8s_cluster)
    access = KubernetesAccess.objects.get(cluster=k8s_cluster)
    assert (access.api_server_url, access.oidc_client_id, access.groups_prefix) == (
        "https://k8s.example.com:6443", "kubectl", "idp:")
    assert access.updated_by == admin
    entry = AuditEntry.objects.get(action="kubernetesaccess.update")
    assert entry.actor == admin and entry.cluster == k8s_cluster
    assert entry.changes["groups_prefix"] == {"before": None, "after": "idp:"}
    assert entry.changes["certificate_authority_data"]["after"].startswith("sha256:")

    client_for(admin).post(page_url(k8s_cluster), {**FORM, "operator_namespaces": "ml, infra"})
    second = AuditEntry.objects.filter(action="kubernetesaccess.update").first()
    assert second.changes == {"operator_namespaces": {"before": "", "after": "ml infra"}}


def test_saving_nothing_new_writes_no_audit_entry(client_for, admin, access):
    data = {name: getattr(access, name) for name in kubeaccess.FIELDS}
    response = client_for(admin).post(page_url(access.cluster), data, follow=True)
    assert "Nothing changed." in response.text
    assert not AuditEntry.objects.exists()


@pytest.mark.parametrize("persona", ["viewer", "operator", "outsider"])
def test_only_admins_change_the_settings(client_for, persona, access, request):
    client = client_for(request.getfixturevalue(persona))
    response = client.post(page_url(access.cluster), {**FORM, "groups_prefix": "x:"})
    assert response.status_code == 403
    access.refresh_from_db()
    assert access.groups_prefix == "idp:"
    assert not AuditEntry.objects.exists()


def test_the_page_answers_only_get_and_post(client_for, admin, access):
    assert client_for(admin).put(page_url(access.cluster)).status_code == 405
    assert client_for(admin).post(download_url(access.cluster)).status_code == 405


@pytest.mark.parametrize("field, value, error", [
    ("api_server_url", "http://k8s.example.com:6443", "An https:// URL."),
    ("certificate_authority_data", "not base64!", "Neither a PEM certificate nor base64"),
    ("certificate_authority_data", base64.b64encode(b"hello").decode(), "No certificate in it"),
    ("operator_namespaces", "ml Infra", "Not namespace names: Infra"),
])
def test_invalid_settings_are_refused_with_the_reason(client_for, admin, access, field, value,
                                                      error):
    response = client_for(admin).post(page_url(access.cluster), {**FORM, field: value})
    assert response.status_code == 400
    assert error in response.text
    assert not AuditEntry.objects.exists()


def test_a_pasted_pem_is_stored_as_base64(client_for, admin, k8s_cluster):
    client_for(admin).post(page_url(k8s_cluster),
                           {**FORM, "certificate_authority_data": CA_PEM})
    stored = KubernetesAccess.objects.get(cluster=k8s_cluster).certificate_authority_data
    assert base64.b64decode(stored).decode() == CA_PEM


def test_the_form_starts_from_the_console_kubeconfig(client_for, admin, k8s_cluster, tmp_path):
    console_kubeconfig = tmp_path / "console.kubeconfig"
    console_kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "repairs",
        "clusters": [{"name": "other", "cluster": {"server": "https://wrong.example.com"}},
                     {"name": "prod", "cluster": {"server": "https://10.0.0.1:6443",
                                                  "certificate-authority-data": CA_DATA}}],
        "contexts": [{"name": "repairs", "context": {"cluster": "prod", "user": "sa"}}],
        "users": [{"name": "sa", "user": {"token": "console-sa-token"}}],
    }))
    Cluster.objects.filter(pk=k8s_cluster.pk).update(scheduler_config=str(console_kubeconfig))

    response = client_for(admin).get(page_url(k8s_cluster))

    form = response.context["form"]
    assert form["api_server_url"].value() == "https://10.0.0.1:6443"
    assert form["certificate_authority_data"].value() == CA_DATA
    assert "come from the kubeconfig this console's repairs use" in response.text
    assert "console-sa-token" not in response.text


# --- the kubeconfig --------------------------------------------------------------------

def test_the_kubeconfig_downloads_as_a_file(client_for, viewer, access):
    response = client_for(viewer).get(download_url(access.cluster))
    assert response.status_code == 200
    assert response["Content-Type"] == "application/yaml"
    assert response["Content-Disposition"] == 'attachment; filename="kubeconfig-k8s-h200.yaml"'
    config = yaml.safe_load(response.content)
    assert config["users"][0]["name"] == "vera@k8s-h200"


def test_the_kubeconfig_runs_kubelogin_with_the_settings(client_for, viewer, access):
    config = yaml.safe_load(client_for(viewer).get(download_url(access.cluster)).content)

    (user,) = config["users"]
    exec_config = user["user"]["exec"]
    assert exec_config["apiVersion"] == "client.authentication.k8s.io/v1"
    assert exec_config["command"] == "kubectl"
    assert exec_config["interactiveMode"] == "IfAvailable"
    assert exec_config["args"] == [
        "oidc-login", "get-token",
        "--oidc-issuer-url=https://idp.example.com/realms/gpu",
        "--oidc-client-id=kubectl",
        "--oidc-extra-scope=groups",
        "--oidc-extra-scope=email",  # the user name claim is email
    ]


def test_the_kubernetes_client_loads_the_kubeconfig(client_for, viewer, access, monkeypatch):
    monkeypatch.setattr("kubernetes.config.kube_config.ExecProvider", KubeloginNotRun)
    KubeloginNotRun.built.clear()
    config = yaml.safe_load(client_for(viewer).get(download_url(access.cluster)).content)

    configuration = client.Configuration()
    loader = KubeConfigLoader(config_dict=config)
    loader.load_and_set(configuration)

    assert loader.current_context["name"] == "k8s-h200"
    assert configuration.host == "https://k8s.example.com:6443"
    with open(configuration.ssl_ca_cert) as ca_file:
        assert ca_file.read() == CA_PEM
    (plugin,) = KubeloginNotRun.built
    assert plugin.api_version == "client.authentication.k8s.io/v1"
    assert plugin.args[:3] == ["kubectl", "oidc-login", "get-token"]
    assert configuration.api_key["BearerToken"] == "Bearer id-token-from-kubelogin"


def test_a_kubeconfig_without_a_ca_uses_the_system_cas(access, viewer):
    access.certificate_authority_data = ""
    config = kubeaccess.kubeconfig(access, kubeaccess.oidc_facts(), viewer)
    assert config["clusters"][0]["cluster"] == {"server": "https://k8s.example.com:6443"}
    KubeConfigLoader(config_dict=config)  # still a valid structure


def test_the_console_client_id_is_used_when_kubectl_has_none(access, viewer):
    access.oidc_client_id = ""
    facts = kubeaccess.oidc_facts()
    assert "--oidc-client-id=clusterui" in kubeaccess.kubelogin_args(access, facts)
    assert "--oidc-client-id=clusterui" in kubeaccess.apiserver_flags(access, facts)


# --- the API server's flags and AuthenticationConfiguration ----------------------------

def test_the_flags_and_the_authentication_configuration_say_the_same(access):
    facts = kubeaccess.oidc_facts()
    flags = dict(flag.removeprefix("--").split("=", 1)
                 for flag in kubeaccess.apiserver_flags(access, facts))
    assert flags == {
        "oidc-issuer-url": ISSUER, "oidc-client-id": "kubectl",
        "oidc-username-claim": "email", "oidc-username-prefix": "oidc:",
        "oidc-groups-claim": "groups", "oidc-groups-prefix": "idp:",
    }
    document = yaml.safe_load(kubeaccess.to_yaml(
        kubeaccess.authentication_configuration(access, facts)))
    assert document["apiVersion"] == "apiserver.config.k8s.io/v1beta1"
    assert document["kind"] == "AuthenticationConfiguration"
    (jwt,) = document["jwt"]
    assert jwt["issuer"] == {"url": flags["oidc-issuer-url"],
                             "audiences": [flags["oidc-client-id"]]}
    assert jwt["claimMappings"] == {
        "username": {"claim": flags["oidc-username-claim"],
                     "prefix": flags["oidc-username-prefix"]},
        "groups": {"claim": flags["oidc-groups-claim"], "prefix": flags["oidc-groups-prefix"]},
    }


def test_an_empty_username_prefix_is_a_dash_in_the_flags_and_empty_in_the_file(access):
    access.username_prefix = ""
    facts = kubeaccess.oidc_facts()
    assert "--oidc-username-prefix=-" in kubeaccess.apiserver_flags(access, facts)
    mapping = kubeaccess.authentication_configuration(access, facts)["jwt"][0]["claimMappings"]
    assert mapping["username"]["prefix"] == ""


# --- the role bindings -----------------------------------------------------------------

def test_the_role_bindings_are_valid_kubernetes_objects_with_the_groups_prefix(
        client_for, viewer, access):
    response = client_for(viewer).get(page_url(access.cluster))
    documents = list(yaml.safe_load_all(response.context["role_bindings_yaml"]))

    models = [as_client_model(document) for document in documents]

    assert models == [
        client.V1ClusterRoleBinding(
            api_version="rbac.authorization.k8s.io/v1", kind="ClusterRoleBinding",
            metadata=client.V1ObjectMeta(name="clusterui-admin"),
            role_ref=cluster_role("cluster-admin"), subjects=[group("idp:gpu-admins")]),
        client.V1ClusterRoleBinding(
            api_version="rbac.authorization.k8s.io/v1", kind="ClusterRoleBinding",
            metadata=client.V1ObjectMeta(name="clusterui-operator"),
            role_ref=cluster_role("edit"),
            subjects=[group("idp:gpu-operators"), group("idp:ml-oncall")]),
        client.V1ClusterRoleBinding(
            api_version="rbac.authorization.k8s.io/v1", kind="ClusterRoleBinding",
            metadata=client.V1ObjectMeta(name="clusterui-viewer"),
            role_ref=cluster_role("view"), subjects=[group("idp:gpu-viewers")]),
    ]


def test_operator_namespaces_get_a_role_binding_each(access):
    access.operator_namespaces = "ml infra"
    documents = list(yaml.safe_load_all(kubeaccess.to_yaml_documents(
        kubeaccess.role_bindings(access, kubeaccess.oidc_facts()))))

    models = [as_client_model(document) for document in documents]

    role_bindings = [m for m in models if isinstance(m, client.V1RoleBinding)]
    assert [(m.metadata.namespace, m.metadata.name) for m in role_bindings] == [
        ("ml", "clusterui-operator"), ("infra", "clusterui-operator")]
    assert all(m.role_ref == cluster_role("edit") for m in role_bindings)
    assert all(m.subjects == [group("idp:gpu-operators"), group("idp:ml-oncall")]
               for m in role_bindings)
    cluster_wide = {m.metadata.name: (m.role_ref.name, [s.name for s in m.subjects])
                    for m in models if isinstance(m, client.V1ClusterRoleBinding)}
    assert cluster_wide == {  # operators also read everything, as they do here
        "clusterui-admin": ("cluster-admin", ["idp:gpu-admins"]),
        "clusterui-viewer": ("view", ["idp:gpu-viewers", "idp:gpu-operators", "idp:ml-oncall"]),
    }


def test_the_bindings_use_the_prefix_the_flags_give_groups(access):
    facts = kubeaccess.oidc_facts()
    flags = dict(flag.removeprefix("--").split("=", 1)
                 for flag in kubeaccess.apiserver_flags(access, facts))
    for document in kubeaccess.role_bindings(access, facts):
        for subject in document["subjects"]:
            idp_group = subject["name"].removeprefix(flags["oidc-groups-prefix"])
            assert subject["name"] == flags["oidc-groups-prefix"] + idp_group
            assert idp_group in ROLE_GROUPS


def test_a_role_without_idp_groups_gets_no_binding(access, settings):
    settings.CLUSTERUI_OIDC_ROLE_GROUPS = "admin=gpu-admins"
    bindings = kubeaccess.role_bindings(access, kubeaccess.oidc_facts())
    assert [b["metadata"]["name"] for b in bindings] == ["clusterui-admin"]


def test_with_operator_namespaces_operators_alone_still_get_view(access, settings):
    settings.CLUSTERUI_OIDC_ROLE_GROUPS = "operator=gpu-operators"
    access.operator_namespaces = "ml"
    bindings = kubeaccess.role_bindings(access, kubeaccess.oidc_facts())
    assert [(b["kind"], b["roleRef"]["name"]) for b in bindings] == [
        ("RoleBinding", "edit"), ("ClusterRoleBinding", "view")]


def test_the_client_models_refuse_a_binding_without_a_role_ref(access):
    """The check above can fail: the client's model requires roleRef."""
    document = kubeaccess.role_bindings(access, kubeaccess.oidc_facts())[0]
    del document["roleRef"]
    with pytest.raises(ValueError, match="role_ref"):
        as_client_model(document)
