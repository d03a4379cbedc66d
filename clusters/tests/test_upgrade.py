"""The release that gave the cluster its own package (clusters/, app label still
"clusterui"): a database migrated at the release before it migrates forward with its rows
intact, and the people signed in through OpenID Connect stay signed in."""

import pytest
from django.contrib.sessions.backends.db import SessionStore
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = ("clusterui", "0013_cluster_degraded_threshold_pct")


def heads():
    return MigrationExecutor(connection).loader.graph.leaf_nodes()


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


@pytest.fixture
def at_the_release_before(transactional_db):
    """The database as the release before left it; migrated to every head again after."""
    latest = heads()
    old = migrate([BEFORE, *(head for head in latest if head[0] != BEFORE[0])])
    yield old
    migrate(latest)


def test_a_database_at_the_release_before_migrates_forward_with_its_rows(at_the_release_before):
    old = at_the_release_before
    Cluster = old.get_model("clusterui", "Cluster")
    AuditEntry = old.get_model("clusterui", "AuditEntry")
    cluster = Cluster.objects.create(name="prod-h200", slug="prod-h200")
    AuditEntry.objects.create(action="cluster.create", object_type="clusterui.cluster",
                              object_id=str(cluster.pk), object_repr="prod-h200",
                              cluster=cluster, actor_name="ada")
    store = SessionStore()
    signed_in = {"_auth_user_id": "7", "_auth_user_backend": "clusterui.oidc.OIDCBackend",
                 "_auth_user_hash": "x"}
    local = {"_auth_user_id": "8",
             "_auth_user_backend": "django.contrib.auth.backends.ModelBackend"}
    Session = old.get_model("sessions", "Session")
    for key, data in (("oidc-session", signed_in), ("local-session", local)):
        Session.objects.create(session_key=key, session_data=store.encode(data),
                               expire_date="2099-01-01T00:00:00Z")

    new = migrate(heads())

    cluster = new.get_model("clusterui", "Cluster").objects.get(slug="prod-h200")
    entry = new.get_model("clusterui", "AuditEntry").objects.get(action="cluster.create")
    assert (entry.cluster_id, entry.object_type) == (cluster.pk, "clusterui.cluster")
    Session = new.get_model("sessions", "Session")
    oidc = store.decode(Session.objects.get(session_key="oidc-session").session_data)
    assert oidc == {**signed_in, "_auth_user_backend": "clusters.oidc.OIDCBackend"}
    assert store.decode(Session.objects.get(session_key="local-session").session_data) == local

