"""/api/v1/: tokens act as their user with the user's role, through the same services and
audit as the pages; errors are problem details; lists take the pages' filters."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from openapi_spec_validator import validate

from api.models import ApiToken
from api.tokens import do_create_api_token, do_revoke_api_token
from clusters.models import AuditEntry
from clusters.roles import Role
from healthchecks.filters import CheckRunFilter, HealthEventFilter
from healthchecks.services import do_record_health_event
from nodes.choices import NodeState
from nodes.filters import NodeFilter
from nodes.tests.factories import NodeFactory
from repairs.choices import Status
from repairs.filters import RepairFilter
from repairs.models import Repair
from repairs.tests.factories import RepairFactory

from .conftest import ApiClient

pytestmark = pytest.mark.django_db
PROBLEM = "application/problem+json"


def test_without_a_usable_token_it_is_401_problem_details(cluster, token_for):
    user, token = token_for(Role.VIEWER)
    for client in (ApiClient(), ApiClient("cui_nope"), ApiClient("not-even-ours")):
        response = client.get("/api/v1/clusters/")
        assert response.status_code == 401 and response["Content-Type"] == PROBLEM
        assert response["WWW-Authenticate"] == "Bearer"
        assert response.json()["title"] == "Unauthorized"
    assert ApiClient(token).get("/api/v1/clusters/").status_code == 200
    do_revoke_api_token(ApiToken.objects.get(user=user), actor=user)
    assert ApiClient(token).get("/api/v1/clusters/").status_code == 401
    _, expired = token_for(Role.VIEWER, username="api-expired")
    ApiToken.objects.filter(user__username="api-expired").update(
        expires_at=timezone.now() - timedelta(seconds=1))
    assert ApiClient(expired).get("/api/v1/clusters/").status_code == 401


def test_a_session_does_not_sign_in_to_the_api(cluster, viewer):
    client = Client()
    client.force_login(viewer)
    assert client.get("/api/v1/clusters/").status_code == 401


def test_a_token_notes_when_it_was_last_used(cluster, token_for):
    user, token = token_for(Role.VIEWER)
    ApiClient(token).get("/api/v1/clusters/")
    assert ApiToken.objects.get(user=user).last_used_at is not None


def test_nodes_come_with_the_pages_filters(cluster, api_as):
    NodeFactory(cluster=cluster, name="gpu-0001", state=NodeState.HEALTHY)
    sick = NodeFactory(cluster=cluster, name="gpu-0002", state=NodeState.UNHEALTHY)
    do_record_health_event(sick, signature="xid:79", severity="critical")
    client, _ = api_as(Role.VIEWER)
    everything = client.get(f"/api/v1/clusters/{cluster.slug}/nodes/").json()
    assert [n["name"] for n in everything["items"]] == ["gpu-0001", "gpu-0002"]
    unhealthy = client.get(f"/api/v1/clusters/{cluster.slug}/nodes/", state="unhealthy").json()
    assert [n["name"] for n in unhealthy["items"]] == ["gpu-0002"]
    assert unhealthy["items"][0]["worst_signal"].startswith("xid:79")
    by_signature = client.get(f"/api/v1/clusters/{cluster.slug}/nodes/", signature="xid:79")
    assert by_signature.json()["count"] == 1
    bad = client.get(f"/api/v1/clusters/{cluster.slug}/nodes/", state="sleepy")
    assert bad.status_code == 400 and bad["Content-Type"] == PROBLEM
    assert "state" in bad.json()["detail"]


def test_a_list_answers_limit_items_from_offset(cluster, api_as):
    for number in range(1, 6):
        NodeFactory(cluster=cluster, name=f"gpu-{number:04}")
    client, _ = api_as(Role.VIEWER)
    nodes = f"/api/v1/clusters/{cluster.slug}/nodes/"
    first = client.get(nodes, limit=2).json()
    assert (first["count"], first["limit"], first["offset"], first["next_offset"]) == (5, 2, 0, 2)
    assert [n["name"] for n in first["items"]] == ["gpu-0001", "gpu-0002"]
    names, offset = [], 0
    while offset is not None:
        page = client.get(nodes, limit=2, offset=offset).json()
        names += [n["name"] for n in page["items"]]
        offset = page["next_offset"]
    assert names == [f"gpu-{number:04}" for number in range(1, 6)]
    past_the_end = client.get(nodes, offset=9).json()
    assert (past_the_end["items"], past_the_end["next_offset"]) == ([], None)
    everything = client.get(nodes).json()
    assert (everything["limit"], len(everything["items"])) == (100, 5)


def test_count_counts_what_the_filters_match(cluster, api_as):
    for number in range(1, 4):
        NodeFactory(cluster=cluster, name=f"gpu-{number:04}", state=NodeState.HEALTHY)
    for number in range(4, 6):
        sick = NodeFactory(cluster=cluster, name=f"gpu-{number:04}", state=NodeState.UNHEALTHY)
        do_record_health_event(sick, signature="xid:79", severity="critical")
    client, _ = api_as(Role.VIEWER)
    unhealthy = client.get(f"/api/v1/clusters/{cluster.slug}/nodes/", state="unhealthy",
                           limit=1).json()
    assert (unhealthy["count"], unhealthy["next_offset"]) == (2, 1)
    assert [n["name"] for n in unhealthy["items"]] == ["gpu-0004"]
    events = client.get(f"/api/v1/clusters/{cluster.slug}/events/", signature="xid",
                        node="gpu-0005").json()
    assert events["count"] == 1 and events["items"][0]["node"] == "gpu-0005"


@pytest.mark.parametrize("query", [{"limit": 0}, {"limit": 1001}, {"limit": "five"},
                                   {"offset": -1}, {"offset": "x"}])
def test_a_bad_limit_or_offset_is_a_422_problem(cluster, api_as, query):
    client, _ = api_as(Role.VIEWER)
    response = client.get(f"/api/v1/clusters/{cluster.slug}/nodes/", **query)
    assert response.status_code == 422 and response["Content-Type"] == PROBLEM
    [error] = response.json()["errors"]
    assert error["loc"][-1] == next(iter(query))


def test_an_unknown_query_parameter_is_a_400_naming_it(cluster, api_as):
    client, _ = api_as(Role.VIEWER)
    response = client.get(f"/api/v1/clusters/{cluster.slug}/nodes/", stat="unhealthy")
    assert response.status_code == 400 and response["Content-Type"] == PROBLEM
    detail = response.json()["detail"]
    assert detail.startswith("Unknown query parameter stat:")
    assert "limit, offset, state, role, signature, name" in detail


# Each list: the filters it takes besides limit and offset.
LIST_FILTERS = {
    "/api/v1/clusters/": [],
    "/api/v1/clusters/{slug}/nodes/": list(NodeFilter.base_filters),
    "/api/v1/clusters/{slug}/events/": list(HealthEventFilter.base_filters),
    "/api/v1/clusters/{slug}/checks/": list(CheckRunFilter.base_filters),
    "/api/v1/clusters/{slug}/repairs/": list(RepairFilter.base_filters),
    "/api/v1/clusters/{slug}/jobs/": ["user", "state", "node"],
    "/api/v1/clusters/{slug}/nodes/{name}/bundles/": [],
    "/api/v1/audit/": ["action", "actor", "cluster"],
}


def answer_schema(operation):
    """What a GET answers with 200, as its OpenAPI schema ({} when it is not JSON)."""
    answer = operation["responses"]["200"].get("content", {}).get("application/json", {})
    return answer.get("schema", {})


def test_every_list_declares_limit_offset_and_its_filters_in_openapi(cluster):
    schema = Client().get("/api/v1/openapi.json").json()
    lists = {path for path, operations in schema["paths"].items() if "get" in operations
             and answer_schema(operations["get"]).get("$ref", "").endswith("Page")}
    assert lists == set(LIST_FILTERS)
    for path, filters in LIST_FILTERS.items():
        declared = {parameter["name"]: parameter
                    for parameter in schema["paths"][path]["get"]["parameters"]
                    if parameter["in"] == "query"}
        assert list(declared) == ["limit", "offset", *filters], path
        assert all(parameter["description"] for parameter in declared.values()), path
        assert declared["limit"]["schema"]["maximum"] == 1000
    states = schema["paths"]["/api/v1/clusters/{slug}/nodes/"]["get"]["parameters"]
    state = next(parameter for parameter in states if parameter["name"] == "state")
    assert state["schema"]["enum"] == list(NodeState.values)
    assert "the node's state" in state["description"]


def test_no_get_answers_a_bare_list(cluster):
    schema = Client().get("/api/v1/openapi.json").json()
    for path, operations in schema["paths"].items():
        if "get" in operations:
            assert answer_schema(operations["get"]).get("type") != "array", path


def test_the_repairs_waiting_for_approval_are_listed_by_status(cluster, api_as):
    """`clusterctl repairs list --status proposed` answered 400: the API's repairs list took
    the history's filter, whose statuses are finished ones only."""
    waiting = RepairFactory(node=NodeFactory(cluster=cluster))
    RepairFactory(node=NodeFactory(cluster=cluster), status=Status.SUCCEEDED,
                  finished_at=timezone.now())
    client, _ = api_as(Role.VIEWER)
    response = client.get(f"/api/v1/clusters/{cluster.slug}/repairs/?status=proposed")
    assert response.status_code == 200
    assert [item["number"] for item in response.json()["items"]] == [waiting.pk]


def test_an_operator_approves_through_the_same_service_and_audit(cluster, api_as):
    repair = RepairFactory(node=NodeFactory(cluster=cluster))
    client, operator = api_as(Role.OPERATOR)
    response = client.post(f"/api/v1/clusters/{cluster.slug}/repairs/{repair.public_id}/approve/",
                           {"comment": "from the pager"})
    assert response.status_code == 200
    body = response.json()
    assert body["reviewed_by"] == operator.username and body["status"] in ("running", "approved",
                                                                          "waiting")
    entry = AuditEntry.objects.get(action="repair.approve")
    assert (entry.actor, entry.source_ip) == (operator, "10.9.8.7")
    again = client.post(f"/api/v1/clusters/{cluster.slug}/repairs/{repair.public_id}/approve/")
    assert again.status_code == 409 and again["Content-Type"] == PROBLEM


def test_a_viewers_write_is_403_and_on_the_audit_trail(cluster, api_as):
    repair = RepairFactory(node=NodeFactory(cluster=cluster))
    client, viewer = api_as(Role.VIEWER)
    response = client.post(f"/api/v1/clusters/{cluster.slug}/repairs/{repair.public_id}/approve/")
    assert response.status_code == 403 and response["Content-Type"] == PROBLEM
    assert "needs the operator role" in response.json()["detail"]
    assert Repair.objects.get(pk=repair.pk).status == Status.PROPOSED
    entry = AuditEntry.objects.get(action="api.forbidden")
    assert entry.actor == viewer and entry.changes["method"] == "POST"
    assert entry.changes["needs"] == "operator" and entry.object_type == "api.apitoken"


def test_unknown_objects_and_bad_bodies_are_problem_details(cluster, api_as):
    client, _ = api_as(Role.OPERATOR)
    missing = client.get("/api/v1/clusters/nope/")
    assert missing.status_code == 404 and missing["Content-Type"] == PROBLEM
    node = NodeFactory(cluster=cluster)
    bad = client.post(f"/api/v1/clusters/{cluster.slug}/nodes/{node.name}/pause/", {})
    assert bad.status_code == 422 and bad.json()["errors"]
    not_a_repair = client.get(f"/api/v1/clusters/{cluster.slug}/repairs/twelve/")
    assert not_a_repair.status_code == 404 and "number or its id" in not_a_repair.json()["detail"]
    assert client.get(f"/api/v1/clusters/{cluster.slug}/repairs/12/").status_code == 404
    wrong = client.post(f"/api/v1/clusters/{cluster.slug}/nodes/{node.name}/repairs/",
                        {"action": "explode", "reason": "x"})
    assert wrong.status_code == 400 and "reboot" in wrong.json()["detail"]
    check = client.post(f"/api/v1/clusters/{cluster.slug}/nodes/{node.name}/checks/",
                        {"check": "nope"})
    assert check.status_code == 400 and "check" in check.json()["detail"]


def test_the_rate_limit_is_per_token_with_retry_after(cluster, token_for, settings):
    from api import v1
    _, token = token_for(Role.VIEWER)
    _, other = token_for(Role.VIEWER, username="api-other")
    throttle = v1.api.throttle[0]
    throttle.rate = "3/min"
    throttle.num_requests, throttle.duration = throttle.parse_rate("3/min")
    try:
        answers = [ApiClient(token).get("/api/v1/clusters/").status_code for _ in range(4)]
        assert answers == [200, 200, 200, 429]
        limited = ApiClient(token).get("/api/v1/clusters/")
        assert limited["Content-Type"] == PROBLEM and int(limited["Retry-After"]) >= 1
        assert ApiClient(other).get("/api/v1/clusters/").status_code == 200
    finally:
        throttle.num_requests, throttle.duration = throttle.parse_rate(
            f"{settings.CLUSTERUI_API_RATE_PER_MIN}/min")


def test_the_openapi_schema_is_served_and_valid(cluster):
    response = Client().get("/api/v1/openapi.json")
    assert response.status_code == 200
    schema = response.json()
    validate(schema)
    assert "/api/v1/clusters/{slug}/repairs/{ref}/approve/" in schema["paths"]
    assert schema["components"]["securitySchemes"]


def test_the_docs_are_served_from_the_installed_package_with_no_cdn(cluster):
    response = Client().get("/api/v1/docs")
    assert response.status_code == 200
    text = response.content.decode()
    assert '<script src="/static/ninja/swagger-ui-bundle.' in text
    assert "cdn" not in text.lower() and "https://" not in text


@pytest.mark.parametrize("path, hint", [
    ("/api/v1/nodes", "/api/v1/docs"),
    ("/api/v1/nope/", "/api/v1/docs"),
    ("/api/v1/clusters", "did you mean /api/v1/clusters/?"),
])
def test_an_unknown_api_path_is_a_404_problem(cluster, token_for, path, hint):
    _, token = token_for(Role.VIEWER)
    for client in (ApiClient(token), ApiClient()):
        response = client.get(path)
        assert response.status_code == 404 and response["Content-Type"] == PROBLEM
        assert hint in response.json()["detail"]


def test_paused_agrees_with_the_state(cluster, token_for):
    NodeFactory(cluster=cluster, name="gpu-001", state=NodeState.PAUSED, paused=True)
    in_window = NodeFactory(cluster=cluster, name="gpu-002", state=NodeState.PAUSED)
    NodeFactory(cluster=cluster, name="gpu-003", state=NodeState.HEALTHY)
    assert not in_window.paused  # paused by a maintenance window, not by an operator
    _, token = token_for(Role.VIEWER)
    nodes = {node["name"]: node for node in ApiClient(token).get(
        f"/api/v1/clusters/{cluster.slug}/nodes/").json()["items"]}
    assert [(nodes[name]["paused"], nodes[name]["paused_by_operator"])
            for name in ("gpu-001", "gpu-002", "gpu-003")] == [(True, True), (True, False),
                                                               (False, False)]


def test_tokens_are_made_on_a_page_shown_once_and_revoked(cluster, operator, client_for):
    client = client_for(operator)
    made = client.post("/account/api-tokens/", {"name": "pager bot", "expires_in_days": 30})
    token = ApiToken.objects.get(user=operator)
    plaintext = made.context["created"]["plaintext"]
    assert plaintext.startswith(f"cui_{token.prefix}_") and plaintext in made.text
    assert plaintext not in client.get("/account/api-tokens/").text
    assert ApiClient(plaintext).get("/api/v1/clusters/").status_code == 200
    client.post(f"/account/api-tokens/{token.prefix}/revoke/")
    assert ApiClient(plaintext).get("/api/v1/clusters/").status_code == 401


def test_nobody_but_its_owner_or_an_admin_revokes_a_token(cluster, operator, viewer, client_for):
    token, _ = do_create_api_token(operator, name="bot", expires_in_days=5)
    assert client_for(viewer).post(f"/account/api-tokens/{token.prefix}/revoke/"
                                   ).status_code == 403
    assert ApiToken.objects.get(pk=token.pk).revoked_at is None
    assert token.prefix not in client_for(viewer).get("/account/api-tokens/").text


def test_a_token_whose_user_lost_every_role_reads_nothing(cluster, token_for):
    from clusters.roles import assign_role
    user, token = token_for(Role.VIEWER)
    assign_role(user, None)
    assert ApiClient(token).get("/api/v1/clusters/").status_code == 401


def test_a_comment_longer_than_the_column_is_a_clear_422(cluster, api_as):
    repair = RepairFactory(node=NodeFactory(cluster=cluster))
    client, _ = api_as(Role.OPERATOR)
    response = client.post(f"/api/v1/clusters/{cluster.slug}/repairs/{repair.pk}/approve/",
                           {"comment": "x" * 501})
    assert response.status_code == 422 and response["Content-Type"] == PROBLEM
    assert client.get(f"/api/v1/clusters/{cluster.slug}/repairs/²/").status_code == 404


def test_one_node_comes_with_its_hygiene_readings_and_an_operator_cleans_it_up(
        cluster, api_as, settings):
    import time

    from gateway.protocol import live_sample
    from nodes.live_store import get_live_store, reset_live_store
    from nodes.models import AgentCommand

    settings.REDIS_URL = ""
    reset_live_store()
    node = NodeFactory(cluster=cluster, name="gpu-0001")
    frame = {"type": "sample", "seq": 1, "ts": time.time(), "gpus": [], "node": {}}
    hygiene = {"processes": {"zombies": 12, "orphans": 3, "tasks": 500, "pid_max": 32768,
                             "checked_at": 1.0}}
    get_live_store().record(cluster.pk, live_sample(frame, node_id=node.pk,
                                                   received_at=time.time(), memory_totals={},
                                                   hygiene=hygiene))
    client, operator = api_as(Role.OPERATOR)
    body = client.get(f"/api/v1/clusters/{cluster.slug}/nodes/gpu-0001/").json()
    assert body["hygiene"]["processes"]["zombies"] == 12
    assert body["hygiene"]["slurmd"] is None
    listed = client.get(f"/api/v1/clusters/{cluster.slug}/nodes/").json()["items"][0]
    assert listed["hygiene"] is None  # one node's page of readings, not every node's

    response = client.post(f"/api/v1/clusters/{cluster.slug}/nodes/gpu-0001/cleanup/")
    assert response.status_code == 202
    command = AgentCommand.objects.get(node=node)
    assert response.json()["id"] == command.pk and response.json()["status"] == "queued"
    assert command.action == "cleanup" and command.requested_by == operator
    reset_live_store()


def test_nodes_carry_their_agent_version_and_filter_by_another_release(api_as, cluster, settings,
                                                                     tmp_path):
    import json

    settings.CLUSTERUI_AGENT_WHEELHOUSE = tmp_path
    (tmp_path / "manifest.json").write_text(json.dumps({"agent_version": "1.2.0", "files": {}}))
    NodeFactory(cluster=cluster, name="gpu-old", agent_version="1.1.0")
    NodeFactory(cluster=cluster, name="gpu-new", agent_version="1.2.0")
    client, _ = api_as(Role.VIEWER)
    nodes = f"/api/v1/clusters/{cluster.slug}/nodes/"

    versions = {n["name"]: n["agent_version"] for n in client.get(nodes).json()["items"]}
    assert versions == {"gpu-old": "1.1.0", "gpu-new": "1.2.0"}
    other = client.get(nodes, agent="other").json()
    assert [n["name"] for n in other["items"]] == ["gpu-old"]
    assert client.get(nodes, agent="older").status_code == 400
