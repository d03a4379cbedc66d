"""The agent's wheelhouse (nodes/wheelhouse.py), /agent/wheels/ and the install command."""

import hashlib
import json

import pytest

from nodes.install_command import daemonset_manifest, install_command, install_panel
from nodes.wheelhouse import (
    MANIFEST,
    Target,
    WheelhouseError,
    pinned_requirements,
    read_manifest,
)

REQUIREMENTS = ['nvidia-ml-py==13.615.71', 'websockets==17.4; python_version >= "3.11"',
                'websockets==15.0.1; python_version < "3.11"']
WHEELS = {
    "clusterui_agent-1.0.0-py3-none-any.whl": b"agent",
    "nvidia_ml_py-13.615.71-py3-none-any.whl": b"nvml",
    "websockets-17.4-cp311-cp311-manylinux_2_28_x86_64.whl": b"ws311",
    "websockets-17.4-cp312-cp312-manylinux_2_28_x86_64.whl": b"ws312",
    "websockets-15.0.1-py3-none-any.whl": b"ws15",
}


def sha(data):
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def wheelhouse(tmp_path, settings):
    settings.CLUSTERUI_AGENT_WHEELHOUSE = tmp_path
    for name, data in WHEELS.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "not-listed.whl").write_bytes(b"stray")
    manifest = {"agent_version": "1.0.0", "agent_wheel": "clusterui_agent-1.0.0-py3-none-any.whl",
                "requirements": REQUIREMENTS, "targets": ["cp311-x86_64", "cp312-x86_64"],
                "files": {name: sha(data) for name, data in WHEELS.items()}}
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    return manifest


def test_every_requirement_is_pinned_with_every_hash_of_its_wheels(wheelhouse):
    lines = pinned_requirements(wheelhouse)
    assert lines[0] == f"clusterui-agent==1.0.0 --hash=sha256:{sha(b'agent')}"
    assert lines[1] == f"nvidia-ml-py==13.615.71 --hash=sha256:{sha(b'nvml')}"
    new = sorted([sha(b"ws311"), sha(b"ws312")])
    assert lines[2] == (f'websockets==17.4 ; python_version >= "3.11" '
                        f"--hash=sha256:{new[0]} --hash=sha256:{new[1]}")
    assert lines[3] == f'websockets==15.0.1 ; python_version < "3.11" --hash=sha256:{sha(b"ws15")}'


def test_a_requirement_without_a_wheel_is_refused_by_name(wheelhouse):
    del wheelhouse["files"]["websockets-15.0.1-py3-none-any.whl"]
    with pytest.raises(WheelhouseError, match="websockets==15.0.1"):
        pinned_requirements(wheelhouse)


def test_markers_are_read_for_the_target_not_this_python():
    from packaging.requirements import Requirement

    old = Target("3.9", "aarch64").marker_environment()
    assert Requirement(REQUIREMENTS[2]).marker.evaluate(old)
    assert not Requirement(REQUIREMENTS[1]).marker.evaluate(old)


def test_the_command_pins_hashes_carries_the_ca_and_never_a_token(wheelhouse):
    pem = "-----BEGIN CERTIFICATE-----\nMIIBexample\n-----END CERTIFICATE-----"
    command = install_command(wheelhouse, "https://console.example.com/", ca_pem=pem)
    assert "--require-hashes" in command and "--no-index" in command and "--isolated" in command
    assert "--find-links https://console.example.com/agent/wheels/" in command
    assert '--cert "$ETC/ca.pem"' in command and "MIIBexample" in command
    assert "--server wss://console.example.com/ws/agent/" in command
    assert '--ca-file "$ETC/ca.pem"' in command
    assert "--trusted-host" not in command
    for line in pinned_requirements(wheelhouse):
        assert line in command.splitlines()
    assert "cj_" not in command and "--token " not in command


def test_an_http_console_is_trusted_by_name_and_spoken_to_over_ws(wheelhouse):
    command = install_command(wheelhouse, "http://127.0.0.1:8000/")
    assert "--trusted-host 127.0.0.1" in command
    assert "--server ws://127.0.0.1:8000/ws/agent/" in command
    assert "ca.pem" not in command


def test_the_panel_says_what_is_missing(tmp_path, settings):
    settings.CLUSTERUI_AGENT_WHEELHOUSE = tmp_path
    assert read_manifest() is None
    assert "build_agent_wheelhouse" in install_panel("https://c.example/")["problem"]


@pytest.mark.django_db
def test_the_wheelhouse_serves_what_its_manifest_lists_and_nothing_else(wheelhouse, client):
    index = client.get("/agent/wheels/")
    assert index.status_code == 200
    text = index.content.decode()
    for name, digest in wheelhouse["files"].items():
        assert f'<a href="{name}#sha256={digest}">{name}</a>' in text
    wheel = client.get("/agent/wheels/clusterui_agent-1.0.0-py3-none-any.whl")
    assert wheel.status_code == 200 and b"".join(wheel.streaming_content) == b"agent"
    assert client.get("/agent/wheels/not-listed.whl").status_code == 404
    assert client.get("/agent/wheels/..%2Fmanifest.json").status_code == 404
    assert client.get("/agent/wheels/manifest.json").status_code == 404


@pytest.mark.django_db
def test_no_wheelhouse_is_a_404_that_says_how_to_build_it(tmp_path, settings, client):
    settings.CLUSTERUI_AGENT_WHEELHOUSE = tmp_path
    response = client.get("/agent/wheels/")
    assert response.status_code == 404 and b"build_agent_wheelhouse" in response.content


@pytest.mark.django_db
def test_the_settings_page_shows_the_command_to_every_role(wheelhouse, cluster, viewer,
                                                           client_for):
    page = client_for(viewer).get(f"/c/{cluster.slug}/settings/").content.decode()
    assert 'id="install-command"' in page
    assert "clusterui-agent 1.0.0" in page
    assert f"--hash=sha256:{sha(b'agent')}" in page


# The oldest Kubernetes release still supported upstream when this was written, and the
# newest the schemas know: the manifest must hold for both.
KUBERNETES_VERSIONS = ("1.31", "1.35")


def test_the_daemonset_validates_against_kubernetes_schemas_and_installs_the_same_wheels(
        wheelhouse):
    import kubernetes_validate
    import yaml

    pem = "-----BEGIN CERTIFICATE-----\nMIIBexample\n-----END CERTIFICATE-----"
    text = daemonset_manifest(wheelhouse, "https://console.example.com/", "prod-h200", pem)
    documents = list(yaml.safe_load_all(text))
    assert [d["kind"] for d in documents] == ["Namespace", "ConfigMap", "DaemonSet"]
    for document in documents:
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(document, version, strict=True)

    config = documents[1]["data"]
    assert config["requirements.txt"].splitlines() == pinned_requirements(wheelhouse)
    assert config["ca.pem"].strip() == pem
    assert 'server = "wss://console.example.com/ws/agent/"' in config["agent.toml"]
    pod = documents[2]["spec"]["template"]["spec"]
    assert pod["hostPID"] is True and pod["runtimeClassName"] == "nvidia"
    (install,) = pod["initContainers"]
    assert "--require-hashes" in install["command"][-1]
    assert "--cert /etc/clusterui-agent/ca.pem" in install["command"][-1]
    (agent,) = pod["containers"]
    token = next(e for e in agent["env"] if e["name"] == "CLUSTERUI_AGENT_TOKEN")
    assert token["valueFrom"]["secretKeyRef"] == {"name": "clusterui-agent-join-token",
                                                  "key": "token"}
    assert not any("cuj_" in str(value) for value in agent["command"])
    mounts = {m["mountPath"] for m in agent["volumeMounts"]}
    assert {"/dev/kmsg", "/var/lib/clusterui-agent"} <= mounts
    paths = {v["name"]: v.get("hostPath", {}).get("path") for v in pod["volumes"]}
    assert paths["state"] == "/var/lib/clusterui-agent" and paths["kmsg"] == "/dev/kmsg"


def test_a_field_kubernetes_does_not_know_fails_the_validation(wheelhouse):
    import kubernetes_validate
    import yaml

    text = daemonset_manifest(wheelhouse, "https://c.example/", "prod-h200")
    daemonset = list(yaml.safe_load_all(text))[2]
    daemonset["spec"]["template"]["spec"]["hostPid"] = True  # a typo the client would drop
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, KUBERNETES_VERSIONS[0], strict=True)


@pytest.mark.django_db
def test_a_kubernetes_clusters_page_offers_the_daemonset(wheelhouse, cluster, viewer,
                                                          client_for):
    client = client_for(viewer)
    assert 'id="agent-daemonset"' not in client.get(f"/c/{cluster.slug}/settings/").content.decode()
    cluster.scheduler = cluster.Scheduler.KUBERNETES
    cluster.save()
    assert 'id="agent-daemonset"' in client.get(f"/c/{cluster.slug}/settings/").content.decode()
    response = client.get(f"/c/{cluster.slug}/settings/agent-daemonset.yaml")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/yaml"
    assert b"kind: DaemonSet" in response.content
