"""clusterctl (cli/), installed with pip into a virtualenv of its own (the standard library
only: nothing of the server comes with it), against a running daphne: tables and --json, an
operator's token approving a repair, a viewer's refused with the API's reason."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from api.tokens import do_create_api_token
from clusters.models import AuditEntry
from clusters.roles import Role
from clusters.tests.factories import ClusterFactory, UserFactory
from healthchecks.services import do_record_health_event
from nodes.choices import NodeState
from nodes.models import Node
from nodes.tests.factories import NodeFactory
from repairs.choices import Status
from repairs.models import Repair
from repairs.tests.factories import RepairFactory

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def clusterctl(tmp_path_factory):
    """The clusterctl command of a fresh virtualenv it was pip-installed into."""
    where = tmp_path_factory.mktemp("clusterctl")
    shutil.copytree(REPO / "cli", where / "cli")
    subprocess.run([sys.executable, "-m", "venv", where / "venv"], check=True)
    subprocess.run([where / "venv" / "bin" / "pip", "install", "-q", where / "cli"],
                   check=True, timeout=300)
    return where / "venv" / "bin" / "clusterctl"


def run(clusterctl, server, token_file, *args):
    env = {"PATH": os.environ["PATH"], "CLUSTERCTL_URL": server.url}
    if token_file:
        env["CLUSTERCTL_TOKEN_FILE"] = str(token_file)
    return subprocess.run([clusterctl, *args], env=env, capture_output=True, text=True,
                          timeout=60)


def token_file(tmp_path, role, name):
    user = UserFactory(username=name, role=role)
    _, plaintext = do_create_api_token(user, name="cli", expires_in_days=1)
    path = tmp_path / f"{name}.token"
    path.write_text(plaintext + "\n")
    return user, path


def test_clusterctl_lists_approves_and_is_refused_by_role(processes, clusterctl, tmp_path):
    cluster = ClusterFactory(name="cli", slug="cli")
    NodeFactory(cluster=cluster, name="gpu-001")
    sick = NodeFactory(cluster=cluster, name="gpu-002", state=NodeState.UNHEALTHY)
    do_record_health_event(sick, signature="xid:79", severity="critical")
    repair = RepairFactory(node=sick)
    server = processes.daphne()
    operator, operator_token = token_file(tmp_path, Role.OPERATOR, "cli-otto")
    _, viewer_token = token_file(tmp_path, Role.VIEWER, "cli-vera")

    nodes = run(clusterctl, server, viewer_token, "nodes", "list", "--state", "unhealthy")
    assert nodes.returncode == 0, nodes.stderr
    header, *rows = nodes.stdout.splitlines()
    assert header.split()[:3] == ["NAME", "STATE", "ROLE"]
    assert [row.split()[:2] for row in rows] == [["gpu-002", "unhealthy"]]

    as_json = run(clusterctl, server, viewer_token, "--json", "events", "list", "--open")
    assert [e["signature"] for e in json.loads(as_json.stdout)] == ["xid:79"]

    refused = run(clusterctl, server, viewer_token, "repairs", "approve", str(repair.pk))
    assert refused.returncode == 1
    assert "Forbidden (403)" in refused.stderr and "needs the operator role" in refused.stderr
    assert Repair.objects.get(pk=repair.pk).status == Status.PROPOSED

    approved = run(clusterctl, server, operator_token, "repairs", "approve", str(repair.pk),
                   "--comment", "from the shell")
    assert approved.returncode == 0, approved.stderr
    assert Repair.objects.get(pk=repair.pk).reviewed_by == operator
    entry = AuditEntry.objects.get(action="repair.approve")
    assert entry.actor == operator and entry.changes.get("comment") == "from the shell"

    cleanup = run(clusterctl, server, operator_token, "nodes", "cleanup", "gpu-001")
    assert cleanup.returncode == 0, cleanup.stderr
    header, row = cleanup.stdout.splitlines()
    assert header.split() == ["NODE", "ACTION", "STATUS", "REQUESTED", "ID"]
    assert row.split()[:3] == ["gpu-001", "cleanup", "queued"]

    missing = run(clusterctl, server, None, "clusters", "list")
    assert missing.returncode == 1 and "no token" in missing.stderr
    unknown = run(clusterctl, server, operator_token, "repairs", "show", "999")
    assert unknown.returncode == 1 and "Not Found (404)" in unknown.stderr


def test_clusterctl_lists_every_page_and_honours_limit(processes, clusterctl, tmp_path):
    cluster = ClusterFactory(name="many", slug="many")
    Node.objects.bulk_create(NodeFactory.build_batch(150, cluster=cluster))
    names = sorted(Node.objects.filter(cluster=cluster).values_list("name", flat=True))
    server = processes.daphne()
    _, viewer_token = token_file(tmp_path, Role.VIEWER, "cli-vera")

    every = run(clusterctl, server, viewer_token, "nodes")  # two pages of 100
    assert every.returncode == 0, every.stderr
    assert [row.split()[0] for row in every.stdout.splitlines()[1:]] == names

    some = run(clusterctl, server, viewer_token, "--json", "nodes", "--limit", "120")
    assert [node["name"] for node in json.loads(some.stdout)] == names[:120]

    none = run(clusterctl, server, viewer_token, "nodes", "--limit", "0")
    assert none.returncode == 2 and "not a number of items" in none.stderr
