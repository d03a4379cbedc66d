"""A fake Kubernetes API server on 127.0.0.1 (no real one can run here), for the scheduler's
tests and the repairs' drain tests.

The fake serves the few endpoints the scheduler uses, with bodies built from the official
client's own models (V1Node, V1Pod, V1PodList, V1Status, ...) serialised by
ApiClient().sanitize_for_serialization, so the real CoreV1Api, urllib3 and the client's
deserialisation all run. It keeps the nodes and pods as a server would: a strategic merge
patch changes the node, an eviction or a DELETE marks the pod terminating (it lingers
until `finish_terminating()`), and `eviction_errors` answers chosen evictions with an error
Status. Every request is recorded: method, path, query, Content-Type, Authorization, JSON body."""

import json
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest
from kubernetes import client

from schedulers.kubernetes import KubernetesScheduler

serialize = client.ApiClient().sanitize_for_serialization

NODE = "gpu-017"
REASON = "clusterui repair #12"


@dataclass
class Request:
    method: str
    path: str
    query: dict
    content_type: str
    authorization: str
    body: object


class FakeKubernetesApi:
    def __init__(self):
        self.nodes = {}  # name -> node JSON
        self.pods = {}  # (namespace, name) -> pod JSON
        self.eviction_errors = {}  # (namespace, name) -> (HTTP status, Status JSON)
        self.requests = []
        self.url = None

    def add_node(self, node):
        node_json = serialize(node)
        self.nodes[node_json["metadata"]["name"]] = node_json

    def add_pod(self, pod):
        pod_json = serialize(pod)
        self.pods[(pod_json["metadata"]["namespace"], pod_json["metadata"]["name"])] = pod_json

    def finish_terminating(self):
        for key, pod in list(self.pods.items()):
            if "deletionTimestamp" in pod["metadata"]:
                del self.pods[key]

    def writes(self):
        return [(r.method, r.path, r.body) for r in self.requests if r.method != "GET"]

    def handle(self, method, path, query, headers, body):
        content_type = headers.get("Content-Type")
        self.requests.append(
            Request(method, path, query, content_type, headers.get("Authorization"), body)
        )
        parts = path.strip("/").split("/")
        if parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4:
            name = parts[3]
            if name not in self.nodes:
                return 404, not_found("nodes", name)
            if method == "GET":
                return 200, self.nodes[name]
            if method == "PATCH":
                if content_type != "application/strategic-merge-patch+json":
                    return 415, status_json(415, "UnsupportedMediaType", content_type)
                merge_patch(self.nodes[name], body)
                return 200, self.nodes[name]
        if method == "GET" and parts == ["api", "v1", "nodes"]:
            node_list = client.V1NodeList(api_version="v1", kind="NodeList",
                                          metadata=client.V1ListMeta(resource_version="4711"),
                                          items=list(self.nodes.values()))
            return 200, serialize(node_list)
        if method == "GET" and parts == ["api", "v1", "pods"]:
            selector = query.get("fieldSelector", [""])[0]
            if not selector.startswith("spec.nodeName="):
                return 400, status_json(400, "BadRequest", f"unexpected selector {selector!r}")
            node_name = selector.removeprefix("spec.nodeName=")
            items = [pod for pod in self.pods.values() if pod["spec"].get("nodeName") == node_name]
            pod_list = client.V1PodList(
                api_version="v1",
                kind="PodList",
                metadata=client.V1ListMeta(resource_version="4711"),
                items=items,
            )
            return 200, serialize(pod_list)
        is_eviction = len(parts) == 7 and parts[2] == "namespaces" and parts[6] == "eviction"
        if method == "POST" and is_eviction:
            key = (parts[3], parts[5])
            if key in self.eviction_errors:
                return self.eviction_errors[key]
            if key not in self.pods:
                return 404, not_found("pods", key[1])
            self.pods[key]["metadata"]["deletionTimestamp"] = serialize(datetime.now(timezone.utc))
            success = client.V1Status(api_version="v1", kind="Status", status="Success")
            return 201, serialize(success)
        is_pod = len(parts) == 6 and parts[2] == "namespaces" and parts[4] == "pods"
        if method == "DELETE" and is_pod:
            key = (parts[3], parts[5])
            if key not in self.pods:
                return 404, not_found("pods", key[1])
            self.pods[key]["metadata"]["deletionTimestamp"] = serialize(datetime.now(timezone.utc))
            return 200, self.pods[key]
        return 404, status_json(404, "NotFound", f"the fake has no {method} {path}")


def merge_patch(target, patch):
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict):
            merge_patch(target.setdefault(key, {}), value)
        else:
            target[key] = value


def status_json(code, reason, message, causes=()):
    status = client.V1Status(
        api_version="v1",
        kind="Status",
        status="Failure",
        code=code,
        reason=reason,
        message=message,
        details=client.V1StatusDetails(causes=list(causes)) if causes else None,
    )
    return serialize(status)


def not_found(kind, name):
    return status_json(404, "NotFound", f'{kind} "{name}" not found')


def pdb_refusal(budget_name):
    """What the API server answers an eviction that a PodDisruptionBudget forbids."""
    return 429, status_json(
        429,
        "TooManyRequests",
        "Cannot evict pod as it would violate the pod's disruption budget.",
        causes=[
            client.V1StatusCause(
                reason="DisruptionBudget",
                message=(
                    f"The disruption budget {budget_name} needs 2 healthy pods and has 2 currently"
                ),
            )
        ],
    )


class Handler(BaseHTTPRequestHandler):
    def do_request(self):
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        status, payload = self.server.fake.handle(
            self.command, url.path, parse_qs(url.query), self.headers, body
        )
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_PATCH = do_POST = do_DELETE = do_request

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_api():
    fake = FakeKubernetesApi()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.fake = fake
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield fake
    server.shutdown()
    server.server_close()
    thread.join()


def write_kubeconfig(fake, path, token="token-for-prod"):
    """A kubeconfig whose current context is the fake's API server."""
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "prod",
        "clusters": [{"name": "prod", "cluster": {"server": fake.url}}],
        "users": [{"name": "clusterui", "user": {"token": token}}],
        "contexts": [{"name": "prod", "context": {"cluster": "prod", "user": "clusterui"}}],
    }))
    return path


@pytest.fixture
def scheduler(fake_api):
    configuration = client.Configuration()
    configuration.host = fake_api.url
    return KubernetesScheduler(client.CoreV1Api(client.ApiClient(configuration)))


def make_node(name=NODE, ready="True", unschedulable=None, annotations=None):
    return client.V1Node(
        api_version="v1",
        kind="Node",
        metadata=client.V1ObjectMeta(name=name, annotations=annotations, resource_version="100"),
        spec=client.V1NodeSpec(unschedulable=unschedulable),
        status=client.V1NodeStatus(
            conditions=[
                client.V1NodeCondition(type="MemoryPressure", status="False"),
                client.V1NodeCondition(type="Ready", status=ready, reason="KubeletReady"),
            ]
        ),
    )


def make_pod(
    name,
    namespace="research",
    owner=("Job", "train-7b"),
    gpus=0,
    labels=None,
    annotations=None,
    service_account="default",
    phase="Running",
    started=None,
):
    owner_references = None
    if owner:
        kind, owner_name = owner
        owner_references = [
            client.V1OwnerReference(
                api_version="batch/v1" if kind == "Job" else "apps/v1",
                kind=kind,
                name=owner_name,
                uid=f"uid-{owner_name}",
                controller=True,
                block_owner_deletion=True,
            )
        ]
    limits = {"cpu": "4", "memory": "16Gi"}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    return client.V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=client.V1ObjectMeta(
            name=name,
            namespace=namespace,
            labels=labels,
            annotations=annotations,
            owner_references=owner_references,
        ),
        spec=client.V1PodSpec(
            node_name=NODE,
            service_account_name=service_account,
            containers=[
                client.V1Container(
                    name="main",
                    image="nvcr.io/nvidia/pytorch:25.01-py3",
                    resources=client.V1ResourceRequirements(limits=limits, requests=limits),
                )
            ],
        ),
        status=client.V1PodStatus(phase=phase, start_time=started),
    )


def eviction_path(namespace, name):
    return f"/api/v1/namespaces/{namespace}/pods/{name}/eviction"


def drain_and_evict(scheduler, stop=False):
    """A drain step's calls: cordon, then evict politely (signal) or by force (stop)."""
    drained = scheduler.drain(NODE, REASON)
    evicted = scheduler.stop(NODE, []) if stop else scheduler.signal(NODE, [], "USR1")
    return drained + "\n" + evicted


