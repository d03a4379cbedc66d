"""Every change made through the console is on the audit trail: who (the actor), what (the
action), on which object, from where (the source IP), and, for settings, before and after.

Each POST endpoint of the role x URL table is posted as an admin from a known address, and
the entry it writes is checked. A POST endpoint missing from AUDITED fails the suite, as a
view missing from the table does.
"""

from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import get_resolver
from django.utils import timezone

from clusters.models import AuditEntry, Cluster
from clusters.roles import Role
from clusters.tests.factories import UserFactory
from tests.test_authorization_matrix import (  # noqa: F401 (fixtures)
    TABLE,
    quick_password_hashing,
    url_for,
    url_patterns,
    world,
)
from nodes.models import Node
from nodes.services import do_pause_node, do_record_hello
from repairs.models import Repair, RepairStep

SOURCE_IP = "10.20.30.40"


def pause_the_node(world):
    do_pause_node(Node.objects.get(name=world["name"]), actor=None, reason="reseat")


def replace_a_gpu(world):
    """The node's latest hello lists another GPU 3: there is an inventory to accept."""
    node = Node.objects.get(name=world["name"])
    start = timezone.now() - timedelta(hours=1)
    gpus = [{"index": i, "uuid": f"GPU-{i:04d}", "name": "NVIDIA H200",
             "pci_bus_id": f"00000000:00:{6 + i:02X}.0", "memory_total_bytes": 150754820096}
            for i in range(8)]
    do_record_hello(node, boot_id="boot-1", gpus=gpus, now=start)
    gpus[3] = {**gpus[3], "uuid": "GPU-new3"}
    do_record_hello(node, boot_id="boot-2", gpus=gpus, now=start + timedelta(minutes=30))


@dataclass(frozen=True)
class Audited:
    action: str
    object_type: str
    before_after: bool = False  # a settings change: each changed field's before and after
    setup: object = None  # makes the POST a change (a paused node to resume)


def open_the_node(world):
    Node.objects.filter(name=world["name"]).update(
        rejoin_open_until=timezone.now() + timedelta(hours=1), rejoin_opened_by="ada")


def open_the_cluster(world):
    Cluster.objects.filter(nodes__name=world["name"]).update(
        rejoin_open_until=timezone.now() + timedelta(hours=1), rejoin_opened_by="ada")


def run_the_repair(world):
    """A running repair, the one abort stops, on a cluster without a scheduler (there is no
    drain to lift: resuming its node is the abort's only change)."""
    repair = Repair.objects.filter(public_id=world["repair"])
    repair.update(status="running", started_at=timezone.now())
    Cluster.objects.filter(repairs__in=repair).update(scheduler="none")


def wait_for_jobs(world):
    """A running repair whose drain waits for a job: what going on now ends."""
    run_the_repair(world)
    RepairStep.objects.create(
        repair=Repair.objects.get(public_id=world["repair"]), position=0, kind="drain",
        status="waiting", started_at=timezone.now(), next_check_at=timezone.now(),
        details={"jobs": [{"id": "41", "user": "alice", "name": "train", "nodes": [],
                           "time_left_s": None}]})


AUDITED = {
    "clusterui:cluster_create": Audited("cluster.create", "clusterui.cluster"),
    "clusterui:cluster_settings": Audited("cluster.update", "clusterui.cluster",
                                          before_after=True),
    "clusterui:join_token_create": Audited("jointoken.create", "nodes.agenttoken"),
    "clusterui:join_token_revoke": Audited("jointoken.revoke", "nodes.agenttoken"),
    "clusterui:kubernetes_access": Audited("kubernetesaccess.update",
                                           "clusterui.kubernetesaccess", before_after=True),
    "nodes:pause": Audited("node.pause", "nodes.node"),
    "nodes:resume": Audited("node.resume", "nodes.node", setup=pause_the_node),
    "healthchecks:accept_gpu_inventory": Audited("node.accept_gpu_inventory", "nodes.node",
                                          setup=replace_a_gpu),
    "nodes:bulk_pause": Audited("node.pause", "nodes.node"),
    "nodes:cleanup": Audited("agentcommand.send", "nodes.agentcommand"),
    "nodes:bundle_request": Audited("agentcommand.send", "nodes.agentcommand"),
    "nodes:bulk_resume": Audited("node.resume", "nodes.node", setup=pause_the_node),
    "healthchecks:bulk_check": Audited("checkrun.request", "healthchecks.checkrun"),
    "nodes:set_role": Audited("node.set_role", "nodes.node", before_after=True),
    "nodes:rejoin_open": Audited("node.rejoin_open", "nodes.node"),
    "clusterui:secrets": Audited("secret.create", "clusterui.secret"),
    "clusterui:secret_delete": Audited("secret.delete", "clusterui.secret"),
    "nodes:rejoin_close": Audited("node.rejoin_close", "nodes.node", setup=open_the_node),
    "nodes:remove": Audited("node.remove", "nodes.node"),
    "clusterui:cluster_rejoin_open": Audited("cluster.rejoin_open", "clusterui.cluster"),
    "clusterui:cluster_rejoin_close": Audited("cluster.rejoin_close", "clusterui.cluster",
                                              setup=open_the_cluster),
    "nodes:bulk_set_role": Audited("node.set_role", "nodes.node", before_after=True),
    "startup:edit": Audited("startupscript.save", "startup.startupscript"),
    "startup:roll_back": Audited("startupscript.rollback", "startup.startupscript"),
    "healthchecks:run": Audited("checkrun.request", "healthchecks.checkrun"),
    "healthchecks:acknowledge": Audited("healthevent.acknowledge", "healthchecks.healthevent"),
    "healthchecks:resolve": Audited("healthevent.resolve", "healthchecks.healthevent"),
    "healthchecks:silence": Audited("silence.create", "healthchecks.silence"),
    "repairs:settings": Audited("repairsettings.update", "repairs.repairsettings",
                                before_after=True),
    "repairs:policy": Audited("repairpolicy.update", "repairs.repairpolicy", before_after=True),
    "repairs:propose": Audited("repair.propose", "repairs.repair"),
    "repairs:approve": Audited("repair.approve", "repairs.repair"),
    "repairs:recommend_again": Audited("repair.recommend_again", "nodes.node"),
    "repairs:reject": Audited("repair.reject", "repairs.repair"),
    "repairs:cancel": Audited("repair.cancel", "repairs.repair"),
    "repairs:abort": Audited("repair.abort", "repairs.repair", setup=run_the_repair),
    "repairs:go_on_now": Audited("repair.go_on_now", "repairs.repair", setup=wait_for_jobs),
    "notifications:create": Audited("notification_channel.create", "notifications.channel"),
    "notifications:detail": Audited("notification_channel.update", "notifications.channel",
                                    before_after=True),
    "notifications:test": Audited("notification_channel.test", "notifications.channel"),
    "notifications:rotate": Audited("notification_channel.rotate_key", "notifications.channel"),
    "notifications:delete": Audited("notification_channel.delete", "notifications.channel"),
    "api_tokens": Audited("apitoken.create", "api.apitoken"),
    "api_token_revoke": Audited("apitoken.revoke", "api.apitoken"),
    "nodes:maintenance": Audited("maintenance.create", "nodes.maintenancewindow"),
    "nodes:maintenance_end": Audited("maintenance.end", "nodes.maintenancewindow"),
    "nodes:maintenance_change": Audited("maintenance.update", "nodes.maintenancewindow",
                                        before_after=True),
    "logout": Audited("user.sign_out", "auth.user"),
}
# Sign-ins are posted by someone not yet signed in: their entries (who, from where, refused
# or not) are tested where they live.
NOT_AUDITED_HERE = {
    "login": "clusters/tests/test_oidc_views.py::test_a_local_sign_in_is_audited",
    "break_glass": "clusters/tests/test_break_glass.py (signed in and refused, with the IP)",
    # An agent's upload, with a node token: no person acts; the bundle's row records it.
    "agent_bundle_upload": "nodes/tests/test_bundles.py",
}


def post_endpoints():
    """URL names an admin may POST to."""
    return [(name, route) for name, route in url_patterns(get_resolver())
            if name in TABLE and TABLE[name].post[Role.ADMIN] not in (405, 403)]


def test_every_post_endpoint_says_what_it_audits():
    missing = sorted(name for name, _ in post_endpoints()
                     if name not in AUDITED and name not in NOT_AUDITED_HERE)
    assert not missing, (
        f"{missing}: add to AUDITED in tests/test_audit_coverage.py the audit "
        f"entry each writes (clusters.services.record_audit, called by its do_* service)")


@pytest.mark.django_db
@pytest.mark.parametrize("name, route",
                         [pytest.param(n, r, id=n) for n, r in post_endpoints() if n in AUDITED])
def test_a_change_through_the_console_is_audited_with_who_what_and_where(world, name, route):
    audited = AUDITED[name]
    if audited.setup:
        audited.setup(world)
    admin = UserFactory(username="ada", password=None, role=Role.ADMIN)
    client = Client(REMOTE_ADDR=SOURCE_IP)
    client.force_login(admin)
    before = set(AuditEntry.objects.values_list("pk", flat=True))

    response = client.post(url_for(name, route, world), TABLE[name].data)

    assert response.status_code == TABLE[name].post[Role.ADMIN]
    new = AuditEntry.objects.exclude(pk__in=before)
    assert [e.action for e in new] == [audited.action], f"POST {name} wrote {list(new)}"
    entry = new.get()
    assert (entry.actor, entry.actor_name, entry.source_ip) == (admin, "ada", SOURCE_IP)
    assert entry.object_type == audited.object_type and entry.object_id and entry.object_repr
    if audited.before_after:
        assert has_before_and_after(entry.changes), entry.changes


def has_before_and_after(changes):
    """{"before": ..., "after": ...} for the whole object (a policy row), or that for each
    changed field: {"region": {"before": ..., "after": ...}, ...}."""
    if {"before", "after"} <= set(changes):
        return True
    return bool(changes) and all(isinstance(v, dict) and {"before", "after"} <= set(v)
                                 for v in changes.values())
