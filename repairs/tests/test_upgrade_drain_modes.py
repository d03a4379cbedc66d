"""The release that brought drain modes: a cluster's one drain_grace_s becomes the deadline of
its policy rows, and repairs made before it are recorded as the drain they had (wait that
long for the jobs, then requeue them), so one still draining goes on as it was approved."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = ("repairs", "0007_ladders_rejections_approval_view_windows")
AFTER = ("repairs", "0008_drain_modes")


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def heads():
    return MigrationExecutor(connection).loader.graph.leaf_nodes()


def others(target):
    """`target` with every other app at its latest migration."""
    return [target, *(head for head in heads() if head[0] != target[0])]


@pytest.fixture
def at_the_release_before(transactional_db):
    latest = heads()
    yield migrate(others(BEFORE))
    migrate(latest)


def test_the_drain_grace_becomes_the_deadline_of_the_policies_and_older_repairs(
        at_the_release_before):
    old = at_the_release_before
    Cluster = old.get_model("clusterui", "Cluster")
    Node = old.get_model("nodes", "Node")
    graceful = Cluster.objects.create(name="a", slug="a")
    default = Cluster.objects.create(name="b", slug="b")
    old.get_model("repairs", "RepairSettings").objects.create(cluster=graceful,
                                                              drain_grace_s=1800)
    Policy = old.get_model("repairs", "RepairPolicy")
    Policy.objects.create(cluster=graceful, signature="xid:79", action="reboot")
    Policy.objects.create(cluster=default, signature="xid:79", action="reboot")
    Repair = old.get_model("repairs", "Repair")
    made = {}
    for cluster, action in ((graceful, "reboot"), (graceful, "cleanup"), (default, "reboot")):
        node = Node.objects.create(cluster=cluster, name=f"{cluster.slug}-{action}",
                                   joined_at="2026-11-01T00:00:00Z")
        made[(cluster.slug, action)] = Repair.objects.create(
            cluster=cluster, node=node, action=action, status="running", signature="manual",
            reason="x", requested_at="2026-12-01T00:00:00Z").pk

    new = migrate(others(AFTER))

    Policy = new.get_model("repairs", "RepairPolicy")
    assert Policy.objects.filter(cluster_id=graceful.pk).values_list(
        "drain_mode", "drain_deadline_s", "drain_at_deadline").get() == ("", 1800, "go_on")
    assert Policy.objects.filter(cluster_id=default.pk).values_list(
        "drain_mode", "drain_deadline_s", "drain_at_deadline").get() == ("", None, "")
    Repair = new.get_model("repairs", "Repair")

    def drain(key):
        return Repair.objects.filter(pk=made[key]).values_list(
            "drain_mode", "drain_deadline_s", "drain_at_deadline").get()

    assert drain(("a", "reboot")) == ("after_jobs", 1800, "go_on")
    assert drain(("a", "cleanup")) == ("no_drain", None, "")
    assert drain(("b", "reboot")) == ("after_jobs", 600, "go_on")
