"""Every API endpoint x every role, as the URL x role matrix does for the pages: who gets
what, each request naming a real object and each allowed write sending a valid body. An
endpoint missing from ENDPOINTS fails the suite. A refused write is on the audit trail; an
allowed one writes the same entry the page does (tests/test_audit_coverage.py)."""

from dataclasses import dataclass, field

import pytest
from django.core.files.base import ContentFile
from django.urls import get_resolver, reverse
from django.utils import timezone

from clusters.models import AuditEntry, Cluster
from clusters.roles import Role
from tests.test_authorization_matrix import url_patterns
from healthchecks.services import do_record_health_event
from nodes.bundles import do_request_bundle, storage
from nodes.models import DiagnosticBundle, Node
from nodes.services import do_pause_node
from nodes.tests.factories import GpuFactory, NodeFactory
from repairs.models import Repair, RepairStep
from repairs.tests.factories import RepairFactory

from .conftest import ApiClient

ANONYMOUS = "no token"
PERSONAS = [ANONYMOUS, Role.VIEWER, Role.OPERATOR, Role.ADMIN]


@dataclass(frozen=True)
class Endpoint:
    method: str
    needs: Role | None  # None: open to everyone, no token needed
    ok: int = 200
    body: dict = field(default_factory=dict)
    audit: str = ""  # the action an allowed write writes
    setup: object = None


def approved(world):
    Repair.objects.filter(public_id=world["public_id"]).update(status="approved")


def running(world):
    repair = Repair.objects.filter(public_id=world["public_id"])
    repair.update(status="running", started_at=timezone.now())
    Cluster.objects.filter(slug=world["slug"]).update(scheduler="none")


def waiting_for_jobs(world):
    running(world)
    RepairStep.objects.create(
        repair=Repair.objects.get(public_id=world["public_id"]), position=0, kind="drain",
        status="waiting", started_at=timezone.now(), next_check_at=timezone.now(),
        details={"jobs": [{"id": "41", "user": "alice", "name": "train", "nodes": ["gpu-1"],
                           "time_left_s": 3600}], "deadline": timezone.now().isoformat()})


def stored_bundle(world):
    """A bundle of the world's node, stored: what download_bundle answers."""
    node = Node.objects.get(name=world["name"])
    bundle = do_request_bundle(node, reason="asked by a test")
    name = storage().save(f"{world['slug']}/{node.name}/{bundle.public_id}.tar.gz",
                          ContentFile(b"a bundle"))
    DiagnosticBundle.objects.filter(pk=bundle.pk).update(status="stored", stored_as=name,
                                                         size_bytes=8, sha256="0" * 64)
    world["bundle_id"] = str(bundle.public_id)


def paused(world):
    do_pause_node(Node.objects.get(name=world["name"]), actor=None, reason="reseat")


VIEW, OPERATE, ADMINISTER = Role.VIEWER, Role.OPERATOR, Role.ADMIN
ENDPOINTS = {
    "api:api-root": Endpoint("GET", None, ok=404),
    "api:openapi-json": Endpoint("GET", None),
    "api:openapi-view": Endpoint("GET", None),  # /api/v1/docs
    "api:unknown": Endpoint("GET", None, ok=404),
    "api:list_clusters": Endpoint("GET", VIEW),
    "api:get_cluster": Endpoint("GET", VIEW),
    "api:list_nodes": Endpoint("GET", VIEW),
    "api:get_node": Endpoint("GET", VIEW),
    "api:list_events": Endpoint("GET", VIEW),
    "api:list_check_runs": Endpoint("GET", VIEW),
    "api:list_repairs": Endpoint("GET", VIEW),
    "api:get_repair": Endpoint("GET", VIEW),
    "api:list_jobs": Endpoint("GET", VIEW),
    "api:list_audit": Endpoint("GET", ADMINISTER),
    "api:approve_repair": Endpoint("POST", OPERATE, body={"comment": "go"},
                                   audit="repair.approve"),
    "api:reject_repair": Endpoint("POST", OPERATE, body={"comment": "no"},
                                  audit="repair.reject"),
    "api:cancel_repair": Endpoint("POST", OPERATE, audit="repair.cancel", setup=approved),
    "api:abort_repair": Endpoint("POST", OPERATE, body={"comment": "wrong node"},
                                 audit="repair.abort", setup=running),
    "api:go_on_now": Endpoint("POST", OPERATE, body={"comment": "the job hangs"},
                              audit="repair.go_on_now", setup=waiting_for_jobs),
    "api:list_bundles": Endpoint("GET", VIEW),
    "api:request_bundle": Endpoint("POST", OPERATE, ok=202, audit="agentcommand.send"),
    "api:download_bundle": Endpoint("GET", OPERATE, audit="diagnosticbundle.download",
                                    setup=stored_bundle),
    "api:propose_repair": Endpoint("POST", OPERATE, ok=201,
                                   body={"action": "reboot", "reason": "flaky"},
                                   audit="repair.propose"),
    "api:pause_node": Endpoint("POST", OPERATE, body={"reason": "reseat"}, audit="node.pause"),
    "api:clean_up_node": Endpoint("POST", OPERATE, ok=202, audit="agentcommand.send"),
    "api:recommend_again": Endpoint("POST", OPERATE, audit="repair.recommend_again"),
    "api:resume_node": Endpoint("POST", OPERATE, audit="node.resume", setup=paused),
    "api:run_check": Endpoint("POST", OPERATE, ok=201, body={"check": "nvml_sanity"},
                              audit="checkrun.request"),
    "api:acknowledge_event": Endpoint("POST", OPERATE, audit="healthevent.acknowledge"),
    "api:silence_event": Endpoint("POST", OPERATE, body={"hours": 2, "reason": "known"},
                                  audit="silence.create"),
}


def api_patterns():
    return [(name, route) for name, route in url_patterns(get_resolver())
            if (name or "").startswith("api:")]


def test_every_api_endpoint_is_in_the_table():
    walked = dict(api_patterns())
    assert sorted(set(walked) - set(ENDPOINTS)) == [], "add each to ENDPOINTS"
    assert sorted(set(ENDPOINTS) - set(walked)) == [], "ENDPOINTS names endpoints now gone"


@pytest.fixture
def world(cluster):
    node = NodeFactory(cluster=cluster, name="gpu-0001")
    event = do_record_health_event(node, signature="xid:79", severity="critical",
                                   gpu=GpuFactory(node=node, index=3))
    repair = RepairFactory(node=NodeFactory(cluster=cluster, name="gpu-0002"))
    return {"slug": cluster.slug, "name": node.name, "event": event.public_id,
            "public_id": repair.public_id, "number": str(repair.pk)}


def path_for(name, route, world):
    kwargs = {}
    for parameter, value in (("slug", world["slug"]), ("name", world["name"]),
                             ("public_id", world["event"]), ("ref", world["number"]),
                             ("bundle_id", world.get("bundle_id"))):
        if f"<{parameter}>" in route or f":{parameter}>" in route:
            kwargs[parameter] = value
    return reverse(name, kwargs=kwargs)


CASES = [pytest.param(name, route, persona,
                      id=f"{name} {persona if isinstance(persona, str) else persona.label}")
         for name, route in api_patterns() if name in ENDPOINTS for persona in PERSONAS]


@pytest.mark.django_db
@pytest.mark.parametrize("name, route, persona", CASES)
def test_each_endpoint_answers_each_role_as_the_table_says(world, token_for, name, route,
                                                           persona):
    endpoint = ENDPOINTS[name]
    if endpoint.setup:
        endpoint.setup(world)
    user, token = (None, None) if persona == ANONYMOUS else token_for(persona)
    client = ApiClient(token)
    path = path_for(name, route, world)
    before = set(AuditEntry.objects.values_list("pk", flat=True))

    response = client.get(path) if endpoint.method == "GET" else client.post(path,
                                                                             endpoint.body)

    new = [entry.action for entry in AuditEntry.objects.exclude(pk__in=before)]
    if endpoint.needs is None:
        assert response.status_code == endpoint.ok
    elif persona == ANONYMOUS:
        assert response.status_code == 401, response.content
    elif persona >= endpoint.needs:
        assert response.status_code == endpoint.ok, response.content
        if endpoint.audit:
            assert endpoint.audit in new, new
            assert all(e.actor == user for e in AuditEntry.objects.exclude(pk__in=before)
                       .filter(action=endpoint.audit))
    else:
        assert response.status_code == 403, response.content
        assert response["Content-Type"] == "application/problem+json"
        assert new == ["api.forbidden"], new


LISTS = [pytest.param(name, route, id=name) for name, route in api_patterns()
         if name.startswith("api:list_")]


@pytest.mark.django_db
@pytest.mark.parametrize("name, route", LISTS)
def test_every_list_answers_limit_items_from_offset_and_refuses_unknown_parameters(
        world, token_for, name, route):
    _, token = token_for(Role.ADMIN)
    client = ApiClient(token)
    path = path_for(name, route, world)
    page = client.get(path, limit=1, offset=0)
    assert page.status_code == 200, page.content
    body = page.json()
    assert set(body) == {"count", "limit", "offset", "next_offset", "items"}
    assert (body["limit"], body["offset"]) == (1, 0) and len(body["items"]) <= 1
    assert body["next_offset"] == (1 if body["count"] > 1 else None)
    unknown = client.get(path, page=2)
    assert unknown.status_code == 400 and unknown["Content-Type"] == "application/problem+json"
    assert "Unknown query parameter page" in unknown.json()["detail"]
    assert "limit, offset" in unknown.json()["detail"]
