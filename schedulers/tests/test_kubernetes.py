"""KubernetesScheduler against a fake API server on 127.0.0.1 (no real one can run here).

The fake serves the few endpoints the scheduler uses, with bodies built from the official
client's own models (V1Node, V1Pod, V1PodList, V1Status, ...) serialised by
ApiClient().sanitize_for_serialization, so the real CoreV1Api, urllib3 and the client's
deserialisation all run. It keeps the nodes and pods as a server would: a strategic merge
patch changes the node, an eviction marks the pod terminating (it lingers until
`finish_terminating()`), and `eviction_errors` answers chosen evictions with an error
Status. Every request is recorded: method, path, query, Content-Type, Authorization, JSON body."""

import json
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest
from kubernetes import client

from schedulers import ExecutorError, Job, SchedulerNode
from schedulers.kubernetes import (
    DRAIN_REASON_ANNOTATION,
    KubernetesScheduler,
    from_kubeconfig,
)

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

    do_GET = do_PATCH = do_POST = do_request

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


def test_drain_cordons_the_node_with_the_reason_in_an_annotation(fake_api, scheduler):
    fake_api.add_node(make_node())

    output = scheduler.drain(NODE, REASON)

    patch = next(r for r in fake_api.requests if r.method == "PATCH")
    assert patch.path == f"/api/v1/nodes/{NODE}"
    assert patch.content_type == "application/strategic-merge-patch+json"
    assert patch.body == {
        "spec": {"unschedulable": True},
        "metadata": {"annotations": {DRAIN_REASON_ANNOTATION: REASON}},
    }
    assert output == f"cordoned {NODE}"


def test_drain_evicts_a_plain_pod_through_the_eviction_api(fake_api, scheduler):
    fake_api.add_node(make_node())
    fake_api.add_pod(make_pod("train-7b-0"))

    output = scheduler.drain(NODE, REASON)

    pods_query = next(r for r in fake_api.requests if r.path == "/api/v1/pods")
    assert pods_query.query == {"fieldSelector": [f"spec.nodeName={NODE}"]}
    eviction = next(r for r in fake_api.requests if r.method == "POST")
    assert eviction.path == eviction_path("research", "train-7b-0")
    assert eviction.body == {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "train-7b-0", "namespace": "research"},
    }
    assert "evicted research/train-7b-0" in output.splitlines()


def test_drain_leaves_daemonset_static_and_finished_pods_alone(fake_api, scheduler):
    fake_api.add_node(make_node())
    fake_api.add_pod(make_pod("dcgm-exporter-x7k2p", "gpu-operator", ("DaemonSet", "dcgm")))
    fake_api.add_pod(
        make_pod(
            f"etcd-{NODE}",
            "kube-system",
            ("Node", NODE),
            annotations={"kubernetes.io/config.mirror": "0f1e2d3c"},
        )
    )
    fake_api.add_pod(make_pod("preprocess-0", phase="Succeeded"))
    fake_api.add_pod(make_pod("train-7b-0"))

    output = scheduler.drain(NODE, REASON)

    evictions = [r.path for r in fake_api.requests if r.method == "POST"]
    assert evictions == [eviction_path("research", "train-7b-0")]
    assert output.splitlines() == [
        f"cordoned {NODE}",
        "left gpu-operator/dcgm-exporter-x7k2p (DaemonSet)",
        f"left kube-system/etcd-{NODE} (static pod)",
        "evicted research/train-7b-0",
    ]


def test_drain_treats_a_pod_already_gone_as_evicted(fake_api, scheduler):
    fake_api.add_node(make_node())
    fake_api.add_pod(make_pod("train-7b-0"))
    fake_api.eviction_errors[("research", "train-7b-0")] = (404, not_found("pods", "train-7b-0"))

    output = scheduler.drain(NODE, REASON)

    assert "research/train-7b-0 already gone" in output.splitlines()


def test_drain_refused_by_a_disruption_budget_names_the_pod_and_evicts_the_rest(
    fake_api, scheduler
):
    fake_api.add_node(make_node())
    fake_api.add_pod(make_pod("web-5d8f7-abcde", "serving", ("ReplicaSet", "web-5d8f7")))
    fake_api.add_pod(make_pod("train-7b-0"))
    fake_api.eviction_errors[("serving", "web-5d8f7-abcde")] = pdb_refusal("web-pdb")

    with pytest.raises(ExecutorError) as error:
        scheduler.drain(NODE, REASON)

    first_line, *progress = str(error.value).splitlines()
    assert first_line == (
        "cannot evict yet (the drain is retried on schedule): pod serving/web-5d8f7-abcde: "
        "429 Too Many Requests: Cannot evict pod as it would violate the pod's disruption "
        "budget.: The disruption budget web-pdb needs 2 healthy pods and has 2 currently"
    )
    assert progress == [f"cordoned {NODE}", "evicted research/train-7b-0"]
    assert fake_api.nodes[NODE]["spec"]["unschedulable"] is True


def test_drain_retried_after_a_refusal_evicts_only_what_is_left(fake_api, scheduler):
    fake_api.add_node(make_node())
    fake_api.add_pod(make_pod("web-5d8f7-abcde", "serving", ("ReplicaSet", "web-5d8f7")))
    fake_api.add_pod(make_pod("train-7b-0"))
    fake_api.eviction_errors[("serving", "web-5d8f7-abcde")] = pdb_refusal("web-pdb")
    with pytest.raises(ExecutorError):
        scheduler.drain(NODE, REASON)
    del fake_api.eviction_errors[("serving", "web-5d8f7-abcde")]
    fake_api.requests.clear()

    output = scheduler.drain(NODE, REASON)

    assert fake_api.writes() == [
        (
            "POST",
            eviction_path("serving", "web-5d8f7-abcde"),
            {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": "web-5d8f7-abcde", "namespace": "serving"},
            },
        )
    ]
    assert output.splitlines() == [
        f"{NODE} already cordoned",
        "evicted serving/web-5d8f7-abcde",
        "research/train-7b-0 is terminating",
    ]


def test_drain_twice_cordons_and_evicts_once(fake_api, scheduler):
    fake_api.add_node(make_node())
    fake_api.add_pod(make_pod("train-7b-0"))
    fake_api.add_pod(make_pod("train-7b-1"))

    scheduler.drain(NODE, REASON)
    writes_after_first_drain = fake_api.writes()
    second_output = scheduler.drain(NODE, REASON)
    fake_api.finish_terminating()
    third_output = scheduler.drain(NODE, REASON)

    assert [(method, path) for method, path, _ in writes_after_first_drain] == [
        ("PATCH", f"/api/v1/nodes/{NODE}"),
        ("POST", eviction_path("research", "train-7b-0")),
        ("POST", eviction_path("research", "train-7b-1")),
    ]
    assert fake_api.writes() == writes_after_first_drain
    assert second_output.splitlines() == [
        f"{NODE} already cordoned",
        "research/train-7b-0 is terminating",
        "research/train-7b-1 is terminating",
    ]
    assert third_output == f"{NODE} already cordoned"


def test_drain_says_when_an_evicted_pod_has_no_controller(fake_api, scheduler):
    fake_api.add_node(make_node())
    fake_api.add_pod(make_pod("debug-shell", owner=None))

    output = scheduler.drain(NODE, REASON)

    assert "evicted research/debug-shell (it has no controller: nothing recreates it)" in output


def test_node_is_drained_once_cordoned_and_its_workload_pods_are_gone(fake_api, scheduler):
    fake_api.add_node(make_node())
    fake_api.add_pod(make_pod("dcgm-exporter-x7k2p", "gpu-operator", ("DaemonSet", "dcgm")))
    fake_api.add_pod(make_pod("train-7b-0"))

    before = scheduler.node(NODE)
    scheduler.drain(NODE, REASON)
    while_terminating = scheduler.node(NODE)
    fake_api.finish_terminating()
    after = scheduler.node(NODE)

    assert before == SchedulerNode(state="Ready", drained=False, reason="")
    assert while_terminating == SchedulerNode(
        state="Ready,SchedulingDisabled", drained=False, reason=REASON
    )
    assert after == SchedulerNode(state="Ready,SchedulingDisabled", drained=True, reason=REASON)


@pytest.mark.parametrize("ready, state", [("False", "NotReady"), ("Unknown", "Unknown")])
def test_node_state_follows_the_ready_condition(fake_api, scheduler, ready, state):
    fake_api.add_node(make_node(ready=ready, unschedulable=True))

    assert scheduler.node(NODE) == SchedulerNode(
        state=f"{state},SchedulingDisabled", drained=True, reason=""
    )


def test_resume_uncordons_and_removes_the_annotation(fake_api, scheduler):
    fake_api.add_node(
        make_node(
            unschedulable=True,
            annotations={DRAIN_REASON_ANNOTATION: REASON, "team": "infra"},
        )
    )

    output = scheduler.resume(NODE)

    patch = next(r for r in fake_api.requests if r.method == "PATCH")
    assert patch.content_type == "application/strategic-merge-patch+json"
    assert patch.body == {
        "spec": {"unschedulable": False},
        "metadata": {"annotations": {DRAIN_REASON_ANNOTATION: None}},
    }
    assert output == f"uncordoned {NODE}"
    assert fake_api.nodes[NODE]["metadata"]["annotations"] == {"team": "infra"}
    assert scheduler.node(NODE) == SchedulerNode(state="Ready", drained=False, reason="")


def test_resume_of_a_schedulable_node_writes_nothing(fake_api, scheduler):
    fake_api.add_node(make_node())

    assert scheduler.resume(NODE) == f"{NODE} already schedulable"
    assert fake_api.writes() == []


def test_running_jobs_are_the_workload_pods_with_their_gpus_user_and_run_time(
    fake_api, scheduler
):
    two_hours_ago = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=2)
    fake_api.add_node(make_node())
    fake_api.add_pod(
        make_pod(
            "train-7b-0",
            gpus=8,
            labels={"clusterui.io/user": "alice"},
            service_account="trainer",
            started=two_hours_ago,
        )
    )
    fake_api.add_pod(
        make_pod(
            "web-5d8f7-abcde",
            "serving",
            ("ReplicaSet", "web-5d8f7"),
            service_account="web",
            started=two_hours_ago,
        )
    )
    fake_api.add_pod(make_pod("eval-0", owner=None, gpus=1, phase="Pending"))
    fake_api.add_pod(make_pod("dcgm-exporter-x7k2p", "gpu-operator", ("DaemonSet", "dcgm"), gpus=1))
    fake_api.add_pod(make_pod("preprocess-0", phase="Failed"))

    jobs = scheduler.running_jobs(NODE)

    assert [job.id for job in jobs] == [
        "research/train-7b-0",
        "serving/web-5d8f7-abcde",
        "research/eval-0",
    ]
    train, web, pending = jobs
    assert 7200 <= train.run_time_s < 7260
    assert train == Job(
        id="research/train-7b-0",
        user="alice",
        name="Job/train-7b",
        gpus=8,
        run_time_s=train.run_time_s,
        account="research",
        nodes=(NODE,),
    )
    assert 15.9 < train.gpu_hours < 16.2  # 8 GPUs for two hours
    assert web == Job(
        id="serving/web-5d8f7-abcde",
        user="serving/web",
        name="ReplicaSet/web-5d8f7",
        gpus=0,
        run_time_s=web.run_time_s,
        account="serving",
        nodes=(NODE,),
    )
    assert pending == Job(id="research/eval-0", user="research/default", gpus=1,
                          account="research", nodes=(NODE,))


def test_running_jobs_sums_the_gpu_limits_of_every_container(fake_api, scheduler):
    pod = make_pod("train-7b-0", gpus=4)
    sidecar = client.V1Container(
        name="sidecar",
        image="busybox",
        resources=client.V1ResourceRequirements(limits={"nvidia.com/gpu": "2"}),
    )
    logger = client.V1Container(name="logger", image="busybox")
    pod.spec.containers += [sidecar, logger]
    fake_api.add_node(make_node())
    fake_api.add_pod(pod)

    assert [job.gpus for job in scheduler.running_jobs(NODE)] == [6]


def test_requeue_is_left_to_the_controllers(scheduler, fake_api):
    assert "nothing to requeue" in scheduler.requeue(["research/train-7b-0"])
    assert fake_api.requests == []


def test_an_api_error_becomes_an_executor_error_with_status_and_reason(fake_api, scheduler):
    with pytest.raises(ExecutorError) as error:
        scheduler.drain("gpu-999", REASON)

    assert str(error.value) == 'reading node gpu-999: 404 Not Found: nodes "gpu-999" not found'


def test_an_eviction_failing_otherwise_stops_the_drain(fake_api, scheduler):
    fake_api.add_node(make_node())
    fake_api.add_pod(make_pod("train-7b-0"))
    forbidden = 'pods "train-7b-0" is forbidden: cannot create pods/eviction'
    fake_api.eviction_errors[("research", "train-7b-0")] = (
        403,
        status_json(403, "Forbidden", forbidden),
    )

    with pytest.raises(ExecutorError) as error:
        scheduler.drain(NODE, REASON)

    assert str(error.value) == (
        "evicting pod research/train-7b-0: 403 Forbidden: "
        'pods "train-7b-0" is forbidden: cannot create pods/eviction'
    )


def test_an_unreachable_api_server_becomes_an_executor_error():
    configuration = client.Configuration()
    configuration.host = "http://127.0.0.1:9"  # discard: nothing listens there
    configuration.retries = 0
    scheduler = KubernetesScheduler(client.CoreV1Api(client.ApiClient(configuration)))

    with pytest.raises(ExecutorError, match="^reading node gpu-017: cannot reach the Kubernetes"):
        scheduler.node(NODE)


def test_from_kubeconfig_talks_to_the_chosen_context(fake_api, tmp_path):
    fake_api.add_node(make_node())
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "elsewhere",
                "clusters": [
                    {"name": "prod", "cluster": {"server": fake_api.url}},
                    {"name": "other", "cluster": {"server": "http://127.0.0.1:9"}},
                ],
                "users": [{"name": "clusterui", "user": {"token": "token-for-prod"}}],
                "contexts": [
                    {"name": "prod-h200", "context": {"cluster": "prod", "user": "clusterui"}},
                    {"name": "elsewhere", "context": {"cluster": "other", "user": "clusterui"}},
                ],
            }
        )
    )

    scheduler = from_kubeconfig(str(kubeconfig), context="prod-h200")

    assert scheduler.node(NODE).state == "Ready"
    assert {r.authorization for r in fake_api.requests} == {"Bearer token-for-prod"}


def test_from_kubeconfig_with_a_missing_file_or_context_raises(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "prod-h200",
                "clusters": [{"name": "prod", "cluster": {"server": "http://127.0.0.1:9"}}],
                "users": [{"name": "clusterui", "user": {"token": "token-for-prod"}}],
                "contexts": [
                    {"name": "prod-h200", "context": {"cluster": "prod", "user": "clusterui"}}
                ],
            }
        )
    )

    with pytest.raises(ExecutorError, match="cannot load the Kubernetes configuration"):
        from_kubeconfig(str(tmp_path / "missing"))
    with pytest.raises(ExecutorError, match="Expected object with name staging"):
        from_kubeconfig(str(kubeconfig), context="staging")


def test_from_kubeconfig_without_a_path_outside_a_cluster_raises(monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)

    with pytest.raises(ExecutorError, match="cannot load the Kubernetes configuration"):
        from_kubeconfig()
