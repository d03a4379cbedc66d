"""The server keeps speaking to the previous agent release (issue 28): the agent of a commit
named here, unpacked from `git archive`, joins today's server over real sockets, is
welcomed, reports and stays healthy, and the console shows its version.

The commit is the one before issue 28's first change, until a second agent release is
tagged; then it becomes that previous release's tag."""

import io
import subprocess
import sys
import tarfile

import pytest

from clusters.tests.factories import ClusterFactory
from nodes.choices import NodeState
from nodes.models import Node
from nodes.services import do_issue_join_token

from .browser import REPO_ROOT
from .integration import Process, agent_url, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

PREVIOUS_AGENT_COMMIT = "90c8042c7fffcf3d21cfbd2898b256eb6749cd22"


def unpack_agent(commit, directory):
    """The agent/ folder of `commit`, unpacked into `directory`."""
    known = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=REPO_ROOT,
                           capture_output=True)
    if known.returncode != 0:
        pytest.skip(f"commit {commit[:12]} is not in this clone (a shallow one?): "
                    "`git fetch --unshallow` to run this test")
    archive = subprocess.run(["git", "archive", "--format=tar", commit, "agent"], cwd=REPO_ROOT,
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(directory, filter="data")
    return directory / "agent"


def test_the_previous_agent_release_joins_reports_and_stays_healthy(processes, tmp_path):
    old_agent = unpack_agent(PREVIOUS_AGENT_COMMIT, tmp_path / "previous")
    old_version = next(line.split('"')[1] for line in
                       (old_agent / "__init__.py").read_text().splitlines()
                       if line.startswith("__version__"))
    cluster = ClusterFactory(name="compat", slug="compat")
    _, join_token = do_issue_join_token(cluster)
    server = processes.daphne(CLUSTERUI_BOOT_WINDOW_S="0")

    # Run from the unpacked folder: `python -m agent` imports the old agent, not this one.
    agent = Process("previous agent", [
        sys.executable, "-m", "agent", "--simulate", "--server", agent_url(server.url),
        "--state-dir", tmp_path / "state", "--node-name", "old-001", "--gpus", "2"],
        env={**processes.env, "CLUSTERUI_AGENT_TOKEN": join_token},
        log_path=processes.directory / "previous-agent.log", cwd=old_agent.parent)
    processes._add(agent).start()

    node = wait_until(lambda: Node.objects.filter(cluster=cluster, name="old-001",
                                                  state=NodeState.HEALTHY).first(),
                      timeout=60, what="the previous release's node registered and healthy")
    assert node.agent_version == old_version
    first_seen = node.last_seen
    wait_until(lambda: Node.objects.get(pk=node.pk).last_seen > first_seen, timeout=20,
               what="its samples keep arriving")
    assert Node.objects.get(pk=node.pk).state == NodeState.HEALTHY
    assert "Traceback" not in agent.log_text()
    status, page = server.get("/agent/wheels/")  # the wheelhouse it would upgrade from
    assert status == 200
