"""Kubernetes access with the console's identities (issue 6).

For a cluster whose repairs run through Kubernetes, three things built from its
KubernetesAccess row and the console's OIDC settings:

- each user's kubeconfig: kubectl runs kubelogin (`kubectl oidc-login get-token`), which
  signs the user in at the same IdP and hands kubectl their ID token;
- the kube-apiserver's OIDC flags, and the same as an AuthenticationConfiguration file;
- the ClusterRoleBindings / RoleBindings that give the IdP groups of the console's three
  roles the Kubernetes roles cluster-admin, edit and view.

Everything is built as Python data and dumped as YAML, so tests can load it back into the
official client's models. The groups prefix is applied in one place, `kubernetes_group`,
for the flags, the AuthenticationConfiguration and the bindings alike.
"""

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass, field

import requests
import yaml
from django import forms
from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.http import HttpRequest

from .models import Cluster, KubernetesAccess
from .oidc import role_groups
from .roles import Role, role_of
from .services import record_audit

# The console's OIDC settings this page needs (the sign-in reads them too).
ISSUER_SETTING = "CLUSTERUI_OIDC_ISSUER"
CLIENT_ID_SETTING = "CLUSTERUI_OIDC_CLIENT_ID"
GROUPS_CLAIM_SETTING = "CLUSTERUI_OIDC_GROUPS_CLAIM"
ROLE_GROUPS_SETTING = "CLUSTERUI_OIDC_ROLE_GROUPS"

KUBERNETES_ROLES = {Role.ADMIN: "cluster-admin", Role.OPERATOR: "edit", Role.VIEWER: "view"}
RBAC_API_GROUP = "rbac.authorization.k8s.io"
BINDING_NAME_PREFIX = "clusterui-"
EXEC_API_VERSION = "client.authentication.k8s.io/v1"
AUTHENTICATION_CONFIG_API_VERSION = "apiserver.config.k8s.io/v1beta1"
KUBELOGIN_INSTALL_HINT = ("kubectl needs the kubelogin plugin: `kubectl krew install oidc-login` "
                          "or `brew install kubelogin` (https://github.com/int128/kubelogin)")
NAMESPACE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
PEM_CERTIFICATE = "-----BEGIN CERTIFICATE-----"
# Fields an admin edits, in the form's order; each change is audited.
FIELDS = ("api_server_url", "certificate_authority_data", "oidc_issuer_url", "oidc_groups_claim",
          "oidc_client_id", "oidc_scopes",
          "username_claim", "username_prefix", "groups_prefix", "operator_namespaces")


@dataclass
class OidcFacts:
    """What the console's OIDC settings say, for Kubernetes: the issuer, the console's client
    id, the groups claim's name, and the IdP groups of each role."""

    issuer_url: str = ""
    client_id: str = ""
    groups_claim: str = ""
    groups_by_role: dict = field(default_factory=dict)  # {Role: [IdP group, ...]}
    missing: list = field(default_factory=list)  # names of unset settings

    @property
    def configured(self):
        return not self.missing


def oidc_facts(access=None):
    """The console's OIDC settings, read with getattr so that a console without OIDC sign-in
    (the embedded demo) gets a page that says what is missing instead of an error; a
    cluster's KubernetesAccess may name another issuer and groups claim for its API server.
    CLUSTERUI_OIDC_ROLE_GROUPS maps each IdP group to a role name: {"gpu-admins": "admin"}."""
    issuer_url = ((access and access.oidc_issuer_url)
                  or getattr(settings, ISSUER_SETTING, "") or "")
    client_id = getattr(settings, CLIENT_ID_SETTING, "") or ""
    groups_claim = ((access and access.oidc_groups_claim)
                    or getattr(settings, GROUPS_CLAIM_SETTING, "") or "")
    group_roles = role_groups()
    groups_by_role = {role: [] for role in Role}
    for group, role_name in sorted(group_roles.items()):
        groups_by_role[Role[str(role_name).upper()]].append(group)
    missing = [name for name, value in ((ISSUER_SETTING, issuer_url),
                                        (CLIENT_ID_SETTING, client_id),
                                        (GROUPS_CLAIM_SETTING, groups_claim),
                                        (ROLE_GROUPS_SETTING, group_roles)) if not value]
    return OidcFacts(issuer_url, client_id, groups_claim, groups_by_role, missing)


DISCOVERY_TIMEOUT_S = 5


def check_issuer(issuer_url):
    """Why the API server could not take ID tokens from this issuer, or None: its OpenID
    Connect discovery document is fetched, and must name this issuer and its signing keys
    (what kube-apiserver reads). kube-apiserver takes only https:// issuers; a loopback
    http:// one (a development IdP) passes with a warning in `issuer_warning`."""
    url = issuer_url.rstrip("/")
    try:
        answer = requests.get(f"{url}/.well-known/openid-configuration",
                              timeout=DISCOVERY_TIMEOUT_S)
        answer.raise_for_status()
        document = answer.json()
    except (requests.RequestException, ValueError) as exc:
        return f"Its discovery document ({url}/.well-known/openid-configuration) could not be " \
               f"read: {exc}"
    if not isinstance(document, dict) or str(document.get("issuer", "")).rstrip("/") != url:
        named = document.get("issuer") if isinstance(document, dict) else None
        return f"Its discovery document names another issuer ({named!r}): give that one."
    if not document.get("jwks_uri"):
        return "Its discovery document has no jwks_uri: the API server could not check tokens."
    return None


def issuer_warning(issuer_url):
    """What to know of an issuer that passed check_issuer(), or ""."""
    if issuer_url.startswith("http://"):
        return ("kube-apiserver takes only https:// issuers: this one serves a development "
                "IdP on loopback and will not work with a real API server.")
    return ""


def is_kubernetes(cluster):
    return cluster.scheduler == cluster.Scheduler.KUBERNETES


def access_for(cluster):
    """The cluster's KubernetesAccess row, or an unsaved one with the defaults."""
    return KubernetesAccess.objects.filter(cluster=cluster).first() or KubernetesAccess(
        cluster=cluster)


def kubectl_client_id(access, facts):
    return access.oidc_client_id or facts.client_id


def kubernetes_group(access, idp_group):
    """The name Kubernetes gives an IdP group: the groups prefix, then the group."""
    return f"{access.groups_prefix}{idp_group}"


def kubernetes_username(access, claim_value):
    return f"{access.username_prefix}{claim_value}"


# --- the user's kubeconfig -------------------------------------------------------------

def kubeconfig(access, facts, user):
    """The kubeconfig for `user` as a dict, or None while the API server URL or the OIDC
    settings are missing. Nothing in it is secret: kubelogin gets the user's token at run
    time, in their browser, and keeps it in their own token cache."""
    if not access.api_server_url or not facts.configured:
        return None
    name = access.cluster.slug
    user_name = f"{user.get_username()}@{name}"
    cluster_entry = {"server": access.api_server_url}
    if access.certificate_authority_data:
        cluster_entry["certificate-authority-data"] = access.certificate_authority_data
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster_entry}],
        "users": [{"name": user_name, "user": {"exec": {
            "apiVersion": EXEC_API_VERSION,
            "command": "kubectl",
            "args": kubelogin_args(access, facts),
            "interactiveMode": "IfAvailable",
            "provideClusterInfo": False,
            "installHint": KUBELOGIN_INSTALL_HINT,
        }}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": user_name}}],
        "current-context": name,
        "preferences": {},
    }


def kubelogin_args(access, facts):
    scopes = list(access.oidc_scope_list)
    if access.username_claim == KubernetesAccess.UsernameClaim.EMAIL and "email" not in scopes:
        scopes.append("email")
    return ["oidc-login", "get-token",
            f"--oidc-issuer-url={facts.issuer_url}",
            f"--oidc-client-id={kubectl_client_id(access, facts)}",
            *[f"--oidc-extra-scope={scope}" for scope in scopes]]


# --- the API server's side -------------------------------------------------------------

def apiserver_flags(access, facts):
    """kube-apiserver's --oidc-* flags. An empty username prefix is written "-" (no prefix):
    left out, Kubernetes would put the issuer URL before every user name but emails."""
    return [
        f"--oidc-issuer-url={facts.issuer_url}",
        f"--oidc-client-id={kubectl_client_id(access, facts)}",
        f"--oidc-username-claim={access.username_claim}",
        f"--oidc-username-prefix={access.username_prefix or '-'}",
        f"--oidc-groups-claim={facts.groups_claim}",
        f"--oidc-groups-prefix={access.groups_prefix}",
    ]


def authentication_configuration(access, facts):
    """The same as the flags, as a structured AuthenticationConfiguration (Kubernetes 1.30
    and later, --authentication-config=FILE; it cannot be combined with the flags)."""
    return {
        "apiVersion": AUTHENTICATION_CONFIG_API_VERSION,
        "kind": "AuthenticationConfiguration",
        "jwt": [{
            "issuer": {"url": facts.issuer_url, "audiences": [kubectl_client_id(access, facts)]},
            "claimMappings": {
                "username": {"claim": access.username_claim, "prefix": access.username_prefix},
                "groups": {"claim": facts.groups_claim, "prefix": access.groups_prefix},
            },
        }],
    }


# --- role bindings ---------------------------------------------------------------------

def role_bindings(access, facts):
    """The bindings for the roles that have IdP groups: admins get cluster-admin and viewers
    view, cluster-wide; operators get edit cluster-wide, or a RoleBinding to edit in each of
    the operator namespaces, and then view everywhere too: as here, they read everything."""
    admins, operators, viewers = (facts.groups_by_role.get(role, [])
                                  for role in (Role.ADMIN, Role.OPERATOR, Role.VIEWER))
    namespaces = access.operator_namespace_list
    bindings = []
    if admins:
        bindings.append(_binding(access, Role.ADMIN, admins))
    if operators:
        bindings += ([_binding(access, Role.OPERATOR, operators, namespace=namespace)
                      for namespace in namespaces] if namespaces
                     else [_binding(access, Role.OPERATOR, operators)])
    view_groups = viewers + (operators if namespaces else [])
    if view_groups:
        bindings.append(_binding(access, Role.VIEWER, view_groups))
    return bindings


def _binding(access, role, idp_groups, namespace=None):
    """A ClusterRoleBinding of the groups to the role's ClusterRole, or with a namespace a
    RoleBinding to it in that namespace."""
    metadata = {"name": f"{BINDING_NAME_PREFIX}{role.label}"}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {
        "apiVersion": f"{RBAC_API_GROUP}/v1",
        "kind": "ClusterRoleBinding" if namespace is None else "RoleBinding",
        "metadata": metadata,
        "roleRef": {"apiGroup": RBAC_API_GROUP, "kind": "ClusterRole",
                    "name": KUBERNETES_ROLES[role]},
        "subjects": [{"apiGroup": RBAC_API_GROUP, "kind": "Group",
                      "name": kubernetes_group(access, group)} for group in idp_groups],
    }


def to_yaml(document):
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=False)


def to_yaml_documents(documents):
    return yaml.safe_dump_all(documents, sort_keys=False, default_flow_style=False)


# --- the page --------------------------------------------------------------------------

def page_context(cluster, access, facts, user):
    """What the page shows: the YAML texts (None where they cannot be built yet) and what
    Kubernetes will call this user."""
    config = kubeconfig(access, facts, user)
    role_groups = [(role, KUBERNETES_ROLES[role],
                    [kubernetes_group(access, g) for g in facts.groups_by_role.get(role, [])])
                   for role in (Role.ADMIN, Role.OPERATOR, Role.VIEWER)]
    return {
        "cluster": cluster,
        "tab": "settings",
        "access": access,
        "facts": facts,
        "kubeconfig_yaml": to_yaml(config) if config is not None else None,
        "apiserver_flags": " \\\n  ".join(["kube-apiserver", *apiserver_flags(access, facts)])
        if facts.configured else None,
        "authentication_configuration_yaml": to_yaml(authentication_configuration(access, facts))
        if facts.configured else None,
        "role_bindings_yaml": to_yaml_documents(role_bindings(access, facts))
        if facts.configured else None,
        "role_groups": role_groups,
        "your_kubernetes_role": KUBERNETES_ROLES.get(role_of(user)),
        "your_username": kubernetes_username(
            access, user.email if access.username_claim == "email" and user.email
            else f"<your {access.username_claim} claim>"),
        "operator_namespaces": access.operator_namespace_list,
    }


def console_kubeconfig_cluster(cluster):
    """{"api_server_url", "certificate_authority_data"} from the kubeconfig the console's
    repairs use (Cluster.scheduler_config), to start an admin's form with; {} when
    there is none or it cannot be read (an in-cluster console's address is the service
    network's, which people cannot reach anyway)."""
    path = cluster.scheduler_config
    if not path:
        return {}
    try:
        with open(path) as f:
            config = yaml.safe_load(f)
        context_name = config["current-context"]
        context = next(c["context"] for c in config["contexts"] if c["name"] == context_name)
        entry = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
    except (OSError, yaml.YAMLError, KeyError, TypeError, StopIteration):
        return {}
    found = {"api_server_url": entry.get("server", ""),
             "certificate_authority_data": entry.get("certificate-authority-data", "")}
    return {key: value for key, value in found.items() if value}


# --- the admin's form and the write ----------------------------------------------------

class KubernetesAccessForm(forms.ModelForm):
    api_server_url = KubernetesAccess._meta.get_field("api_server_url").formfield(
        assume_scheme="https")
    oidc_issuer_url = KubernetesAccess._meta.get_field("oidc_issuer_url").formfield(
        assume_scheme="https")

    class Meta:
        model = KubernetesAccess
        fields = list(FIELDS)
        widgets = {"certificate_authority_data": forms.Textarea(attrs={"rows": 4,
                                                                       "class": "mono"})}

    def clean_certificate_authority_data(self):
        """Base64 of a PEM bundle, as a kubeconfig holds it; a pasted PEM is encoded."""
        value = self.cleaned_data["certificate_authority_data"].strip()
        if not value:
            return ""
        if value.startswith("-----BEGIN"):
            pem = value
            value = base64.b64encode((pem + "\n").encode()).decode()
        else:
            value = "".join(value.split())
            try:
                pem = base64.b64decode(value, validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                raise forms.ValidationError("Neither a PEM certificate nor base64 of one.")
        if PEM_CERTIFICATE not in pem:
            raise forms.ValidationError(f"No certificate in it: a PEM bundle starts with "
                                        f"{PEM_CERTIFICATE}.")
        return value

    def clean_operator_namespaces(self):
        names = self.cleaned_data["operator_namespaces"].replace(",", " ").split()
        bad = [n for n in names if len(n) > 63 or not NAMESPACE_NAME.match(n)]
        if bad:
            raise forms.ValidationError(f"Not namespace names: {', '.join(bad)} (lower-case "
                                        f"letters, digits and '-', at most 63).")
        return " ".join(dict.fromkeys(names))

    def clean_oidc_issuer_url(self):
        """Checked against its discovery document, as the creation page does."""
        url = self.cleaned_data["oidc_issuer_url"].rstrip("/")
        problem = check_issuer(url) if url else None
        if problem:
            raise forms.ValidationError(problem)
        return url

    def clean_oidc_scopes(self):
        return " ".join(dict.fromkeys(self.cleaned_data["oidc_scopes"].replace(",", " ").split()))


def _audited_value(name, value):
    """A CA bundle is recorded by its digest, not its few kilobytes."""
    if name == "certificate_authority_data" and value:
        return f"sha256:{hashlib.sha256(value.encode()).hexdigest()}"
    return value


@transaction.atomic
def do_update_kubernetes_access(cluster: Cluster, form, *, actor: AbstractBaseUser,
                                request: HttpRequest | None = None) -> list[str]:
    """Save the admin's valid form onto the cluster's row (made on the first save); the audit
    entry holds each changed field before/after. Returns the names of the changed fields."""
    access, created = KubernetesAccess.objects.select_for_update().get_or_create(cluster=cluster)
    before = {name: None if created else getattr(access, name) for name in FIELDS}
    for name in FIELDS:
        setattr(access, name, form.cleaned_data[name])
    access.updated_by = actor
    access.save()
    changed = {name: {"before": _audited_value(name, before[name]),
                      "after": _audited_value(name, getattr(access, name))}
               for name in FIELDS if before[name] != getattr(access, name)}
    if changed:
        record_audit(actor, "kubernetesaccess.update", access, changes=changed, cluster=cluster,
                     request=request)
    return list(changed)
