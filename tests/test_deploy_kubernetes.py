"""deploy/kubernetes: the server's manifests validate against Kubernetes' OpenAPI JSON schemas
(kubernetes-validate, strict: an unknown field fails, where the client's models would drop
it), and they run the processes README "Running it in production" lists, from commands
this checkout has. The image (deploy/kubernetes/Dockerfile) cannot be built here (no
container engine); its commands are checked the same way."""

import re
import shlex
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from django.conf import settings
from django.core.management import get_commands

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "deploy" / "kubernetes" / "clusterui.yaml"
DOCKERFILE = REPO / "deploy" / "kubernetes" / "Dockerfile"
KUBERNETES_VERSIONS = ("1.31", "1.35")


def documents():
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


def containers():
    for document in documents():
        spec = document.get("spec", {}).get("template", {}).get("spec")
        if spec:
            for container in spec["containers"]:
                yield document, container


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_validates_strictly(version):
    for document in documents():
        kubernetes_validate.validate(document, version, strict=True)


def test_the_processes_are_the_readmes():
    commands = {document["metadata"]["name"]: container["command"]
                for document, container in containers()}
    readme = (REPO / "README.md").read_text()
    queues = set(re.findall(r"celery -A clusterui worker -Q (\w+)", readme))
    assert queues == set(settings.CELERY_TASK_QUEUES)
    for queue in queues:
        assert ["-Q", queue] == commands[f"clusterui-worker-{queue}"][6:8]
    assert "clusterui.asgi:application" in commands["clusterui-web"]
    assert commands["clusterui-gateway"][:3] == ["python", "manage.py", "agent_gateway"]
    assert commands["clusterui-publisher"] == ["python", "manage.py", "publisher"]
    # Only the publisher's pods lead the publisher (it always may): they fold the samples.
    (config,) = [d for d in documents() if d["kind"] == "ConfigMap"]
    assert config["data"]["CLUSTERUI_PUBLISHER_LEADS"] == "false"
    assert commands["clusterui-beat"][4:6] == ["clusterui", "beat"]
    assert commands["clusterui-migrate-1-0-0"] == ["python", "manage.py", "migrate", "--noinput"]


def test_each_management_command_they_run_exists():
    known = set(get_commands())
    run = [container["command"][2] for _, container in containers()
           if container["command"][:2] == ["python", "manage.py"]]
    run += re.findall(r"python manage\.py (\w+)", DOCKERFILE.read_text())
    assert run and set(run) <= known, set(run) - known


def test_the_servers_are_probed_and_the_ingress_routes_the_agents():
    by_name = {document["metadata"]["name"]: container for document, container in containers()}
    for name, port in (("clusterui-web", 8000), ("clusterui-gateway", 8001),
                       ("clusterui-uploads", 8002)):
        probe = by_name[name]["readinessProbe"]["httpGet"]
        assert (probe["path"], probe["port"]) == ("/healthz", port)
        # Django answers only hosts it allows: the probe says one the ConfigMap lists.
        assert {"name": "Host", "value": "localhost"} in probe["httpHeaders"]
    (config,) = [d for d in documents() if d["kind"] == "ConfigMap"]
    assert "localhost" in config["data"]["ALLOWED_HOSTS"].split(",")
    (ingress,) = [d for d in documents() if d["kind"] == "Ingress"]
    routes = {p["path"]: p["backend"]["service"]["name"]
              for p in ingress["spec"]["rules"][0]["http"]["paths"]}
    assert routes == {"/ws/agent/": "clusterui-gateway", "/agent/bundles/": "clusterui-uploads",
                      "/": "clusterui-web"}


def test_the_dockerfile_copies_what_exists_and_builds_the_wheelhouse():
    text = DOCKERFILE.read_text()
    for line in text.splitlines():
        if line.startswith("COPY ") and line != "COPY . .":
            for source in shlex.split(line)[1:-1]:
                assert (REPO / source).exists(), source
    assert "build_agent_wheelhouse" in text and "CLUSTERUI_AGENT_WHEELHOUSE" in text
    key = re.search(r"SECRET_KEY=(\S+)", text).group(1)
    assert len(key) >= 50  # production settings refuse a shorter one
