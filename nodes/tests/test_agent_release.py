"""Each node's agent version against the release this console installs."""

import ast
import json

import pytest

from nodes.wheelhouse import MANIFEST, agent_is_behind, console_agent_version

from .factories import NodeFactory


@pytest.fixture
def release(tmp_path, settings):
    """This console installs 1.2.0 (its wheelhouse's manifest says so)."""
    settings.CLUSTERUI_AGENT_WHEELHOUSE = tmp_path
    (tmp_path / MANIFEST).write_text(json.dumps({"agent_version": "1.2.0", "files": {}}))
    return "1.2.0"


def test_the_release_is_the_wheelhouses_else_the_agent_folders(tmp_path, settings, release):
    assert console_agent_version() == "1.2.0"
    settings.CLUSTERUI_AGENT_WHEELHOUSE = tmp_path / "none"
    # The agent's own assignment, read by the parser (the server may not import the agent).
    module = ast.parse((settings.BASE_DIR / "agent" / "__init__.py").read_text())
    (version,) = [node.value.value for node in module.body if isinstance(node, ast.Assign)
                  and node.targets[0].id == "__version__"]
    assert console_agent_version() == version


@pytest.mark.parametrize("version, behind", [
    ("1.1.9", True), ("1.2.0", False), ("1.10.0", False), ("0.9", True),
    ("hand-built", True), ("", False),
])
def test_behind_compares_releases_not_text(version, behind):
    assert agent_is_behind(version, "1.2.0") is behind


@pytest.mark.django_db
def test_the_list_flags_nodes_behind_and_filters_those_on_another_release(
        release, cluster, viewer, client_for):
    for name, version in (("gpu-old", "1.1.0"), ("gpu-new", "1.2.0"), ("gpu-never", "")):
        NodeFactory(cluster=cluster, name=name, agent_version=version)
    client = client_for(viewer)

    page = client.get(f"/c/{cluster.slug}/nodes/").content.decode()
    assert page.count('class="badge agent-behind"') == 1
    assert "agent 1.1.0" in page

    other = client.get(f"/c/{cluster.slug}/nodes/?agent=other").content.decode()
    assert 'data-node="gpu-old"' in other
    assert 'data-node="gpu-new"' not in other and 'data-node="gpu-never"' not in other

    detail = client.get(f"/c/{cluster.slug}/nodes/gpu-old/").content.decode()
    assert "behind this console&#x27;s 1.2.0" in detail or "behind this console's 1.2.0" in detail
    overview = client.get(f"/c/{cluster.slug}/").content.decode()
    assert 'id="other-agents"' in overview and "1 node runs another agent release" in overview

