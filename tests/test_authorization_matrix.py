"""Every URL pattern x every persona: who gets what.

TABLE says, for each URL name, what GET and POST answer to each persona: anonymous, a
signed-in user with no role, viewer, operator and admin. test_every_url_pattern_is_in_the_table
walks the project's URL patterns (and the WebSocket routes), so a new view that is not in
the table fails the suite until someone decides, and writes down, who may use it.

Each request names a real object (a cluster, a node, a health event, a repair, a join token),
so a view that checks the role only after fetching the object is tested too, and each
allowed POST sends a valid body: the answer is the view's real answer, not a form error.
"""

import hashlib
import json
import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import pytest
from asgiref.sync import sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.shortcuts import resolve_url
from django.test import Client
from django.urls import URLResolver, get_resolver, reverse
from django.utils import timezone

from clusters.models import Cluster, KubernetesAccess
from clusters.roles import Role
from clusters.secret_store import do_set_secret
from clusters.tests.factories import UserFactory
from healthchecks.services import do_record_health_event
from startup.services import Validation, do_save_startup_script
from api.tokens import do_create_api_token
from nodes.services import do_create_maintenance_window, do_issue_join_token
from notifications.services import do_create_channel
from nodes.bundles import do_request_bundle
from nodes.tests.factories import GpuFactory, NodeFactory
from repairs.models import RepairSettings
from repairs.tests.factories import RepairFactory

ANONYMOUS = "anonymous"
NO_ROLE = "no role"
PERSONAS = [ANONYMOUS, NO_ROLE, Role.VIEWER, Role.OPERATOR, Role.ADMIN]
TO_SIGN_IN = "to sign-in"  # a redirect to the sign-in page, with ?next= this URL


def needs(role, status):
    """A view behind sign-in and a role: signed out, to sign-in; signed in below `role`, 403;
    `role` and above, `status`."""
    return {ANONYMOUS: TO_SIGN_IN, NO_ROLE: 403,
            **{held: status if held >= role else 403 for held in Role}}


def not_allowed():
    """The method is refused (405) to the signed-in; sign-in is asked for first."""
    return {persona: TO_SIGN_IN if persona == ANONYMOUS else 405 for persona in PERSONAS}


def everyone(status):
    """Exempt from sign-in: every persona gets `status` (its own guard is tested below)."""
    return {persona: status for persona in PERSONAS}


def signed_out_and_in(signed_out, signed_in):
    return {persona: signed_out if persona == ANONYMOUS else signed_in for persona in PERSONAS}


@dataclass(frozen=True)
class Row:
    get: dict
    post: dict
    public_id: str = ""  # which object a <uuid:public_id> names: event, repair or join_token
    data: dict = field(default_factory=dict)  # a valid POST body


VIEW, OPERATE, ADMINISTER = Role.VIEWER, Role.OPERATOR, Role.ADMIN
# A valid channel form's fields besides name, kind and URL (the world's channel waits 30 s:
# posting these is a change).
CHANNEL_FIELDS = {"kinds": ["repair_awaiting_approval", "node_unhealthy"], "min_severity": "warning",
         "signature_prefix": "", "enabled": "on", "group_wait_s": 60, "group_interval_s": 120,
         "repeat_interval_s": 14400, "max_per_hour": 30, "send_resolved": "on"}

TABLE = {
    # Exempt from sign-in, each with its own guard.
    "login": Row(get=signed_out_and_in(200, 302), post=signed_out_and_in(200, 302)),
    "logout": Row(get=not_allowed(), post=everyone(302)),
    "metrics": Row(get=everyone(401), post=everyone(405)),  # bearer token: see below
    "metrics_targets": Row(get=everyone(401), post=everyone(405)),  # the same token
    "healthz": Row(get=everyone(200), post=everyone(405)),
    # The agent's upload: a node token, not a person (nodes/tests/test_bundles.py).
    "agent_bundle_upload": Row(get=everyone(405), post=everyone(401)),
    # The agent's wheelhouse, for nodes (no session): only what its manifest lists, each hash
    # pinned by the install command (nodes/tests/test_wheelhouse.py); here a node's name.
    "agent_wheels": Row(get=everyone(200), post=everyone(405)),
    "agent_wheel": Row(get=everyone(404), post=everyone(405)),
    # Sign-in pages (their guards: clusters/tests/test_break_glass.py, test_oidc_views.py).
    # An empty break-glass form is shown again with its errors; the OIDC views are 404 while
    # OpenID Connect is off, as here.
    "break_glass": Row(get=everyone(200), post=everyone(200)),
    "sign_in_failed": Row(get=everyone(302), post=everyone(405)),
    "signed_out": Row(get=everyone(200), post=everyone(405)),
    "oidc_authentication_init": Row(get=everyone(404), post=everyone(405)),
    "oidc_authentication_callback": Row(get=everyone(404), post=everyone(405)),
    # clusterui
    "home": Row(get=needs(VIEW, 302), post=not_allowed()),
    "clusterui:cluster_list": Row(get=needs(VIEW, 200), post=not_allowed()),
    "clusterui:cluster_create": Row(
        get=needs(ADMINISTER, 200), post=needs(ADMINISTER, 302),
        data={"slug": "dev-l40s", "name": "dev-l40s", "gpus_per_node": 4,
              "billing_rate_per_gpu_hour": "1.5", "scheduler": "none",
              "degraded_threshold_pct": 10, "planned_nodes": 2, "step": "create"}),
    "clusterui:audit": Row(get=needs(ADMINISTER, 200), post=not_allowed()),
    "clusterui:audit_csv": Row(get=needs(ADMINISTER, 200), post=not_allowed()),
    "clusterui:overview": Row(get=needs(VIEW, 200), post=not_allowed()),
    "clusterui:cluster_settings": Row(
        get=needs(VIEW, 200), post=needs(ADMINISTER, 302),
        data={"name": "prod-h200", "gpus_per_node": 8, "billing_rate_per_gpu_hour": "2.5",
              "scheduler": "none", "degraded_threshold_pct": 10}),
    "clusterui:join_token_create": Row(get=not_allowed(), post=needs(ADMINISTER, 200),
                                       data={"note": "rack 12", "expires_in_hours": 24}),
    "clusterui:cluster_rejoin_open": Row(get=not_allowed(), post=needs(ADMINISTER, 302),
                                         data={"hours": 2}),
    "clusterui:cluster_rejoin_close": Row(get=not_allowed(), post=needs(ADMINISTER, 302)),
    "clusterui:join_token_revoke": Row(get=not_allowed(), post=needs(ADMINISTER, 302),
                                       public_id="join_token"),
    "clusterui:kubernetes_access": Row(
        get=needs(VIEW, 200), post=needs(ADMINISTER, 302),
        data={"api_server_url": "https://k8s.example.com:6443", "oidc_client_id": "kubectl",
              "oidc_scopes": "groups", "username_claim": "email", "username_prefix": "oidc:",
              "groups_prefix": "idp:"}),
    "clusterui:kubeconfig_download": Row(get=needs(VIEW, 200), post=not_allowed()),
    "clusterui:agent_daemonset": Row(get=needs(VIEW, 200), post=not_allowed()),
    "clusterui:secrets": Row(get=needs(ADMINISTER, 200), post=needs(ADMINISTER, 302),
                             data={"name": "BMC_PASSWORD", "value": "s3cret", "description": ""}),
    "clusterui:secret_delete": Row(get=not_allowed(), post=needs(ADMINISTER, 302)),
    # notifications (notifications/views.py)
    "notifications:list": Row(get=needs(VIEW, 200), post=not_allowed()),
    "notifications:create": Row(
        get=needs(ADMINISTER, 200), post=needs(ADMINISTER, 302),
        data={"name": "ops-mail", "kind": "apprise",
              "url": "mailto://127.0.0.1:2525?mode=insecure&from=c@example.com&to=o@example.com",
              **CHANNEL_FIELDS}),
    "notifications:detail": Row(get=needs(VIEW, 200), post=needs(ADMINISTER, 302),
                                data={"name": "ops-webhook", "url": "", **CHANNEL_FIELDS}),
    "notifications:deliveries": Row(get=needs(VIEW, 302), post=not_allowed()),  # to the page
    "notifications:test": Row(get=not_allowed(), post=needs(ADMINISTER, 302)),
    "notifications:rotate": Row(get=not_allowed(), post=needs(ADMINISTER, 200)),
    "notifications:delete": Row(get=not_allowed(), post=needs(ADMINISTER, 302)),
    # API tokens (api/views.py): everyone with a role makes their own
    "api_tokens": Row(get=needs(VIEW, 200), post=needs(VIEW, 200),
                      data={"name": "bot", "expires_in_days": 30}),
    "api_token_revoke": Row(get=not_allowed(), post=needs(ADMINISTER, 302)),
    # nodes
    "nodes:list": Row(get=needs(VIEW, 200), post=not_allowed()),
    "nodes:detail": Row(get=needs(VIEW, 200), post=not_allowed()),
    "nodes:pause": Row(get=not_allowed(), post=needs(OPERATE, 302), data={"reason": "reseat"}),
    "nodes:resume": Row(get=not_allowed(), post=needs(OPERATE, 302)),
    "healthchecks:accept_gpu_inventory": Row(get=not_allowed(), post=needs(OPERATE, 302)),
    "nodes:charts": Row(get=needs(VIEW, 200), post=not_allowed()),
    "nodes:live": Row(get=needs(VIEW, 200), post=not_allowed()),
    "nodes:hygiene": Row(get=needs(VIEW, 200), post=not_allowed()),
    "nodes:cleanup": Row(get=not_allowed(), post=needs(OPERATE, 302)),
    "nodes:bundle_request": Row(get=not_allowed(), post=needs(OPERATE, 302)),
    # The world's bundle is another node's, and still being collected: nothing to download.
    "nodes:bundle_download": Row(get=needs(OPERATE, 404), post=not_allowed(), public_id="bundle"),
    "nodes:bulk_pause": Row(get=not_allowed(), post=needs(OPERATE, 302),
                            data={"nodes": ["gpu-0001"], "reason": "reseat"}),
    "nodes:bulk_resume": Row(get=not_allowed(), post=needs(OPERATE, 302),
                             data={"nodes": ["gpu-0001"]}),
    "healthchecks:bulk_check": Row(get=not_allowed(), post=needs(OPERATE, 302),
                            data={"nodes": ["gpu-0001"], "check": "nvml_sanity"}),
    "nodes:set_role": Row(get=not_allowed(), post=needs(ADMINISTER, 302),
                          data={"role": "login"}),
    "nodes:rejoin_open": Row(get=not_allowed(), post=needs(ADMINISTER, 302), data={"hours": 2}),
    "nodes:rejoin_close": Row(get=not_allowed(), post=needs(ADMINISTER, 302)),
    "nodes:remove": Row(get=not_allowed(), post=needs(ADMINISTER, 302),
                        data={"reason": "decommissioned"}),
    "nodes:maintenance": Row(get=needs(VIEW, 200), post=needs(OPERATE, 302),
                             data={"reason": "rack 12 power work", "nodes": "gpu-0001",
                                   "starts_at": "2026-12-05 02:00"}),
    "nodes:maintenance_end": Row(get=not_allowed(), post=needs(OPERATE, 302)),
    "nodes:maintenance_change": Row(get=not_allowed(), post=needs(OPERATE, 302),
                                    data={"reason": "reseat GPU 3", "ends_at": ""}),
    "nodes:bulk_set_role": Row(get=not_allowed(), post=needs(ADMINISTER, 302),
                               data={"nodes": ["gpu-0001"], "role": "login"}),
    # startup scripts (startup/views.py)
    "startup:list": Row(get=needs(VIEW, 200), post=not_allowed()),
    "startup:edit": Row(get=needs(VIEW, 200), post=needs(ADMINISTER, 302),
                        data={"body": "#!/bin/bash\necho ready\n", "timeout_s": 60}),
    "startup:versions": Row(get=needs(VIEW, 200), post=not_allowed()),
    "startup:roll_back": Row(get=not_allowed(), post=needs(ADMINISTER, 302)),
    # healthchecks
    "healthchecks:list": Row(get=needs(VIEW, 200), post=not_allowed()),
    "healthchecks:runs": Row(get=needs(VIEW, 200), post=not_allowed()),
    "healthchecks:run": Row(get=not_allowed(), post=needs(OPERATE, 302),
                            data={"node": "gpu-0001", "check": "nvml_sanity"}),
    "healthchecks:acknowledge": Row(get=not_allowed(), post=needs(OPERATE, 302),
                                    public_id="event"),
    "healthchecks:resolve": Row(get=not_allowed(), post=needs(OPERATE, 302), public_id="event",
                                data={"comment": "GPU reseated"}),
    "healthchecks:silence": Row(get=not_allowed(), post=needs(OPERATE, 302), public_id="event",
                                data={"hours": "4", "reason": "vendor ticket"}),
    # repairs
    "repairs:list": Row(get=needs(VIEW, 200), post=not_allowed()),
    "repairs:history_csv": Row(get=needs(VIEW, 200), post=not_allowed()),
    "repairs:settings": Row(
        get=needs(VIEW, 200), post=needs(ADMINISTER, 302),
        data={"provider": "simulated", "blast_radius_pct": 20,
              "boot_timeout_s": 1800, "window_mode": "record_only",
              "window_action": "remove", "xid_window_count": 5, "xid_window_hours": 24,
              "repair_window_count": 5, "repair_window_days": 7}),
    "repairs:policy": Row(get=not_allowed(), post=needs(ADMINISTER, 302),
                          data={"signature": "xid:79", "action": "reboot"}),
    "repairs:node": Row(get=needs(VIEW, 302), post=not_allowed()),  # to the node page
    # jobs
    "jobs:list": Row(get=needs(VIEW, 200), post=not_allowed()),
    "jobs:csv": Row(get=needs(VIEW, 200), post=not_allowed()),
    "repairs:propose": Row(get=not_allowed(), post=needs(OPERATE, 302),
                           data={"action": "reboot", "reason": "slow GPU 3"}),
    "repairs:detail": Row(get=needs(VIEW, 200), post=not_allowed(), public_id="repair"),
    # The world's Kubernetes cluster cannot be read: approving says so and is confirmed.
    "repairs:approve": Row(get=not_allowed(), post=needs(OPERATE, 302), public_id="repair",
                           data={"confirm_unknown_jobs": "on"}),
    "repairs:recommend_again": Row(get=not_allowed(), post=needs(OPERATE, 302)),
    "repairs:reject": Row(get=not_allowed(), post=needs(OPERATE, 302), public_id="repair"),
    "repairs:cancel": Row(get=not_allowed(), post=needs(OPERATE, 302), public_id="repair"),
    "repairs:abort": Row(get=not_allowed(), post=needs(OPERATE, 302), public_id="repair",
                         data={"comment": "wrong node", "node_after": "resume"}),
    "repairs:go_on_now": Row(get=not_allowed(), post=needs(OPERATE, 302), public_id="repair",
                             data={"comment": "the job hangs"}),
}

# Browser and agent WebSocket routes, and the test of each one's guard.
WEBSOCKET_TABLE = {
    "ws/agent/": "test_the_agent_socket_wants_an_agent_token_not_a_session",
    "ws/live/cluster/<slug:slug>/": "test_the_live_socket_wants_a_viewer_from_this_site",
}


def url_patterns(resolver, prefix="", namespace=""):
    """(name, route) of every URL pattern under `resolver`, through includes."""
    for entry in resolver.url_patterns:
        route = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            inner = f"{namespace}{entry.namespace}:" if entry.namespace else namespace
            yield from url_patterns(entry, route, inner)
        else:
            yield (f"{namespace}{entry.name}" if entry.name else None), route


def websocket_routes(router, prefix=""):
    for route in router.routes:
        if isinstance(route.callback, URLRouter):
            yield from websocket_routes(route.callback, prefix + str(route.pattern))
        else:
            yield prefix + str(route.pattern)


def the_websocket_router():
    from clusterui.asgi import application

    return application.application_mapping["websocket"]


def test_every_url_pattern_is_in_the_table():
    # The API's endpoints have a matrix of their own: api/tests/test_api_matrix.py.
    walked = {name: route for name, route in url_patterns(get_resolver())
              if not (name or "").startswith("api:")}
    unnamed = [route for name, route in url_patterns(get_resolver()) if name is None]
    assert not unnamed, f"Name these URL patterns (and add them to TABLE): {unnamed}"
    missing = sorted(set(walked) - set(TABLE))
    assert not missing, (
        f"{missing}: not in tests/test_authorization_matrix.py's TABLE. Add each "
        f"with what GET and POST answer to every persona (needs(Role.X, status) for a view "
        f"behind a role, not_allowed() for a method it refuses); a view exempt from sign-in "
        f"also gets a test of its own guard.")
    gone = sorted(set(TABLE) - set(walked))
    assert not gone, f"TABLE names URLs that no longer exist: {gone}"


def test_every_websocket_route_is_in_the_table():
    routes = sorted(websocket_routes(the_websocket_router()))
    assert routes == sorted(WEBSOCKET_TABLE), (
        "Add each WebSocket route to WEBSOCKET_TABLE with a test of its guard.")


# The matrix.


@pytest.fixture(autouse=True)
def quick_password_hashing(settings):
    """The personas' passwords are never used (the client signs in with force_login)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def world(cluster, settings, tmp_path):
    """One real object of each kind a URL names. The cluster runs Kubernetes and the console
    signs in through an IdP, so that the Kubernetes access pages have something to show."""
    settings.CLUSTERUI_METRICS_TOKEN = "metrics-token-for-tests"
    settings.CLUSTERUI_AGENT_WHEELHOUSE = tmp_path
    wheel = settings.CLUSTERUI_AGENT_WHEELHOUSE / "clusterui_agent-1.0.0-py3-none-any.whl"
    wheel.write_bytes(b"wheel")
    (settings.CLUSTERUI_AGENT_WHEELHOUSE / "manifest.json").write_text(json.dumps({
        "agent_version": "1.0.0", "agent_wheel": wheel.name, "requirements": [],
        "targets": ["cp311-x86_64"], "files": {wheel.name: hashlib.sha256(b"wheel").hexdigest()}}))
    settings.CLUSTERUI_OIDC_ISSUER = "https://idp.example.com/realms/gpu"
    settings.CLUSTERUI_OIDC_CLIENT_ID = "clusterui"
    settings.CLUSTERUI_OIDC_GROUPS_CLAIM = "groups"
    settings.CLUSTERUI_OIDC_ROLE_GROUPS = "admin=gpu-admins,viewer=gpu-viewers"
    Cluster.objects.filter(pk=cluster.pk).update(scheduler="kubernetes")
    cluster.refresh_from_db()
    KubernetesAccess.objects.create(cluster=cluster, api_server_url="https://k8s.example.com:6443",
                                    oidc_client_id="kubectl")
    node = NodeFactory(cluster=cluster, name="gpu-0001")
    gpu = GpuFactory(node=node, index=3)
    event = do_record_health_event(node, signature="xid:79", severity="critical", gpu=gpu,
                                   message="GPU has fallen off the bus")
    repair = RepairFactory(node=NodeFactory(cluster=cluster, name="gpu-0002"))
    bundle = do_request_bundle(repair.node, reason="asked by setter")
    join_token, _ = do_issue_join_token(cluster, note="rack 12")
    for body in ("#!/bin/bash\ntrue\n", "#!/bin/bash\necho up\n"):
        do_save_startup_script(cluster, event="node_boot", role="worker", body=body,
                               timeout_s=60, validation=Validation())
    setter = UserFactory(username="setter", role=Role.ADMIN)
    do_set_secret("IPMI_PASSWORD", "hunter2", actor=setter)
    channel, _ = do_create_channel(cluster, name="ops-webhook", kind="webhook",
                                   url="https://hooks.example.com/clusterui",
                                   rules=[{"kind": "repair_awaiting_approval"}], actor=setter)
    api_token, _ = do_create_api_token(setter, name="bot", expires_in_days=30)
    window = do_create_maintenance_window(cluster, reason="reseat", nodes=[node],
                                          starts_at=timezone.now(), actor=setter)
    return {"slug": cluster.slug, "name": node.name, "event": event.public_id,
            "prefix": api_token.prefix, "window_id": window.pk,
            "secret": "IPMI_PASSWORD", "channel_id": channel.pk,
            "repair": repair.public_id, "join_token": join_token.public_id,
            "lifecycle": "node_boot", "role": "worker", "number": 1,
            "bundle": bundle.public_id, "bundle_id": str(bundle.public_id)}


def url_for(name, route, world):
    row = TABLE[name]
    kwargs = {}
    for parameter in re.findall(r"<(?:\w+:)?(\w+)>", route):
        kwargs[parameter] = world[row.public_id] if parameter == "public_id" else world[parameter]
    return reverse(name, kwargs=kwargs)


def client_as(persona):
    client = Client()
    if persona == ANONYMOUS:
        return client
    user = UserFactory(username=f"persona-{persona if persona == NO_ROLE else persona.label}",
                       role=None if persona == NO_ROLE else persona)
    client.force_login(user)
    return client


def persona_id(persona):
    return persona if isinstance(persona, str) else persona.label


CASES = [
    pytest.param(name, route, method, persona, id=f"{name} {method} {persona_id(persona)}")
    for name, route in url_patterns(get_resolver()) if name in TABLE
    for method in ("GET", "POST")
    for persona in PERSONAS
]


@pytest.mark.django_db
@pytest.mark.parametrize("name, route, method, persona", CASES)
def test_each_url_answers_each_persona_as_the_table_says(world, name, route, method, persona):
    row = TABLE[name]
    url = url_for(name, route, world)
    client = client_as(persona)
    if method == "GET":
        response = client.get(url)
    else:
        response = client.post(url, row.data)

    expected = (row.get if method == "GET" else row.post)[persona]
    if expected == TO_SIGN_IN:
        assert response.status_code == 302, f"{method} {url}: {response.status_code}"
        location = urlsplit(response["Location"])
        assert location.path == resolve_url(settings.LOGIN_URL), response["Location"]
        assert f"next={url}" in location.query.replace("%2F", "/")
    else:
        assert response.status_code == expected, (
            f"{method} {url} as {persona_id(persona)}: {response.status_code}, "
            f"the table says {expected}")


HTMX_CASES = [
    pytest.param(name, route, method, id=f"{name} {method}")
    for name, route in url_patterns(get_resolver()) if name in TABLE
    for method in ("GET", "POST")
    if (TABLE[name].get if method == "GET" else TABLE[name].post)[ANONYMOUS] == TO_SIGN_IN
]


@pytest.mark.django_db
@pytest.mark.parametrize("name, route, method", HTMX_CASES)
def test_a_signed_out_htmx_request_is_told_to_sign_in(world, name, route, method):
    """htmx cannot follow a redirect to the sign-in page (it would swap the page into a
    fragment): it gets 401 and HX-Redirect, to come back to the page it was on."""
    url = url_for(name, route, world)
    page = "/c/prod-h200/"
    headers = {"HX-Request": "true", "HX-Current-URL": f"http://testserver{page}"}
    client = Client()
    response = client.get(url, headers=headers) if method == "GET" else client.post(
        url, TABLE[name].data, headers=headers)
    assert response.status_code == 401, f"{method} {url}: {response.status_code}"
    redirect = urlsplit(response["HX-Redirect"])
    assert redirect.path == resolve_url(settings.LOGIN_URL)
    assert f"next={page}" in redirect.query.replace("%2F", "/")


# Exempt from sign-in: each one's own guard.


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/metrics", "/metrics?cluster=", "/metrics/targets"])
def test_metrics_wants_its_bearer_token(client, settings, path):
    settings.CLUSTERUI_METRICS_TOKEN = "metrics-token-for-tests"
    assert client.get(path).status_code == 401
    wrong = client.get(path, headers={"Authorization": "Bearer not-it"})
    assert wrong.status_code == 401
    right = client.get(path, headers={"Authorization": "Bearer metrics-token-for-tests"})
    assert right.status_code == 200
    settings.CLUSTERUI_METRICS_TOKEN = None
    assert client.get(path).status_code == 404  # off until a token is set


@pytest.mark.django_db
@pytest.mark.parametrize("started", [False, True], ids=["no sign-in started", "another state"])
def test_the_oidc_callback_signs_no_one_in_without_the_state_it_handed_out(client, settings,
                                                                            started):
    from clusters.tests.oidc import enable_oidc

    enable_oidc(settings)
    if started:
        assert client.get(reverse("oidc_authentication_init")).status_code == 302
    response = client.get(reverse("oidc_authentication_callback"),
                          {"code": "stolen-code", "state": "forged-state"})
    assert response.status_code == 302
    assert urlsplit(response["Location"]).path == reverse("sign_in_failed")
    assert "_auth_user_id" not in client.session


def test_static_files_are_served_without_sign_in(client):
    response = client.get("/static/css/console.css")
    assert response.status_code == 200
    assert b"".join(response.streaming_content)


# WebSockets.


def this_site():
    return f"http://{settings.ALLOWED_HOSTS[0]}".encode()


async def open_socket(path, *, persona=ANONYMOUS, origin=None, token=None):
    """Connect as `persona` (with its session cookie): (communicator, accepted, close code)."""
    headers = []
    if origin is not None:
        headers.append((b"origin", origin))
    if token is not None:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    if persona != ANONYMOUS:
        client = await sync_to_async(client_as)(persona)
        session = client.cookies[settings.SESSION_COOKIE_NAME].value
        headers.append((b"cookie", f"{settings.SESSION_COOKIE_NAME}={session}".encode()))
    from clusterui.asgi import application

    communicator = WebsocketCommunicator(application, path, headers=headers)
    accepted, code = await communicator.connect(timeout=5)
    return communicator, accepted, code


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("persona, origin, accepted", [
    (ANONYMOUS, "this site", False),
    (NO_ROLE, "this site", False),
    (Role.VIEWER, "this site", True),
    (Role.OPERATOR, "this site", True),
    (Role.ADMIN, "this site", True),
    (Role.VIEWER, b"http://evil.example", False),
    (Role.VIEWER, None, False),
], ids=lambda value: persona_id(value) if isinstance(value, (Role, str)) else str(value))
async def test_the_live_socket_wants_a_viewer_from_this_site(in_memory_channel_layer, cluster,
                                                             persona, origin, accepted):
    origin = this_site() if origin == "this site" else origin
    communicator, was_accepted, _ = await open_socket(
        f"/ws/live/cluster/{cluster.slug}/", persona=persona, origin=origin)
    assert was_accepted is accepted
    await communicator.disconnect()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("persona, token", [
    (ANONYMOUS, None),
    (ANONYMOUS, "not-a-token"),
    (Role.ADMIN, None),  # a browser session is no agent token
])
async def test_the_agent_socket_wants_an_agent_token_not_a_session(in_memory_channel_layer,
                                                                   cluster, persona, token):
    communicator, accepted, _ = await open_socket("/ws/agent/", persona=persona,
                                                  origin=this_site(), token=token)
    # The agent protocol accepts, then closes with 4401 (PROTOCOL.md): the agent sees why.
    assert accepted
    assert await communicator.receive_output(timeout=5) == {"type": "websocket.close",
                                                           "code": 4401}
    await communicator.disconnect()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_agent_socket_takes_a_join_token(in_memory_channel_layer, cluster):
    _, plaintext = await sync_to_async(do_issue_join_token)(cluster)
    communicator, accepted, _ = await open_socket("/ws/agent/", token=plaintext)
    assert accepted and await communicator.receive_nothing(timeout=0.5)
    await communicator.disconnect()
