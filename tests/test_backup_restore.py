"""Backup and restore as README.md ("Backup and restore") says (issue 28): `pg_dump` of the
console's database, restored into an empty PostgreSQL database, brings the console back with
its history (nodes, events, repairs, the audit trail), and its secrets open with the same
CLUSTERUI_SECRETS_KEYS, which the dump does not hold."""

import subprocess
import sys
import uuid

import pytest
from django.db import connection

from clusters.roles import Role
from clusters.secret_store import do_set_secret
from clusters.tests.factories import ClusterFactory, UserFactory
from healthchecks.services import do_record_health_event
from nodes.tests.factories import GpuFactory, NodeFactory
from repairs.tests.factories import RepairFactory

from .browser import REPO_ROOT, database_url, subprocess_env
from .conftest import require_postgresql

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

HISTORY = """
from clusters.models import AuditEntry
from clusters.secret_store import value_of
from healthchecks.models import HealthEvent
from nodes.models import Node
from repairs.models import Repair
repair = Repair.objects.get()
print(Node.objects.get().name, HealthEvent.objects.get().signature,
      [e.signature for e in repair.events.all()], repair.status,
      sorted(set(AuditEntry.objects.values_list("action", flat=True))),
      value_of("slack-webhook"))
"""


def run(argv, env=None):
    done = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"{argv[:3]}: {done.stderr[-2000:]}"
    return done.stdout


def test_a_dump_restored_into_an_empty_database_brings_back_the_history(tmp_path):
    db = require_postgresql()
    cluster = ClusterFactory(name="prod-h200", slug="prod-h200")
    node = NodeFactory(cluster=cluster, name="gpu-017")
    event = do_record_health_event(node, signature="xid:79", severity="critical",
                                   gpu=GpuFactory(node=node, index=3),
                                   message="GPU has fallen off the bus")
    repair = RepairFactory(node=node)
    repair.events.add(event)
    admin = UserFactory(username="ada", role=Role.ADMIN)
    do_set_secret("slack-webhook", "https://hooks.example/T0/B0/xyz", actor=admin)
    dump = tmp_path / "clusterui.dump"

    # README.md "Backup and restore": the commands an admin runs.
    run(["pg_dump", "--format=custom", "--no-owner", f"--file={dump}", database_url(db)])
    restored = f"restored_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cursor:
        cursor.execute(f'CREATE DATABASE "{restored}"')
    try:
        restored_url = database_url({**db, "NAME": restored})
        run(["pg_restore", "--no-owner", "--exit-on-error", f"--dbname={restored_url}",
             str(dump)])
        env = subprocess_env(DATABASE_URL=restored_url)
        run([sys.executable, "manage.py", "migrate", "--check"], env)  # nothing to apply
        history = run([sys.executable, "manage.py", "shell", "-v", "0", "-c", HISTORY], env)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{restored}" WITH (FORCE)')

    line = history.strip().splitlines()[-1]
    assert line.startswith("gpu-017 xid:79 ['xid:79'] proposed"), line
    assert "'secret.create'" in line
    assert line.endswith("https://hooks.example/T0/B0/xyz"), line
