"""KubernetesScheduler against the fake API server of schedulers/tests/kubernetes_fake.py."""

import json
from datetime import datetime, timedelta, timezone

import pytest
from kubernetes import client

from schedulers import ExecutorError, Job, SchedulerNode
from schedulers.kubernetes import (
    DRAIN_REASON_ANNOTATION,
    KubernetesScheduler,
    from_kubeconfig,
)

from .kubernetes_fake import (  # noqa: F401 - fake_api and scheduler are fixtures
    NODE,
    REASON,
    FakeKubernetesApi,
    drain_and_evict,
    eviction_path,
    fake_api,
    make_node,
    make_pod,
    not_found,
    pdb_refusal,
    scheduler,
    serialize,
    status_json,
    write_kubeconfig,
)


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


def test_signal_evicts_a_plain_pod_through_the_eviction_api(fake_api, scheduler):
    fake_api.add_node(make_node())
    fake_api.add_pod(make_pod("train-7b-0"))

    output = drain_and_evict(scheduler)

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


def test_signal_leaves_daemonset_static_and_finished_pods_alone(fake_api, scheduler):
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

    output = drain_and_evict(scheduler)

    evictions = [r.path for r in fake_api.requests if r.method == "POST"]
    assert evictions == [eviction_path("research", "train-7b-0")]
    assert output.splitlines() == [
        f"cordoned {NODE}",
        "left gpu-operator/dcgm-exporter-x7k2p (DaemonSet)",
        f"left kube-system/etcd-{NODE} (static pod)",
        "evicted research/train-7b-0",
    ]


def test_signal_treats_a_pod_already_gone_as_evicted(fake_api, scheduler):
    fake_api.add_node(make_node())
    fake_api.add_pod(make_pod("train-7b-0"))
    fake_api.eviction_errors[("research", "train-7b-0")] = (404, not_found("pods", "train-7b-0"))

    output = drain_and_evict(scheduler)

    assert "research/train-7b-0 already gone" in output.splitlines()


def test_signal_refused_by_a_disruption_budget_names_the_pod_and_evicts_the_rest(
    fake_api, scheduler
):
    fake_api.add_node(make_node())
    fake_api.add_pod(make_pod("web-5d8f7-abcde", "serving", ("ReplicaSet", "web-5d8f7")))
    fake_api.add_pod(make_pod("train-7b-0"))
    fake_api.eviction_errors[("serving", "web-5d8f7-abcde")] = pdb_refusal("web-pdb")

    output = drain_and_evict(scheduler)

    assert output.splitlines() == [
        f"cordoned {NODE}",
        "cannot evict yet (asked again at the next check): pod serving/web-5d8f7-abcde: "
        "429 Too Many Requests: Cannot evict pod as it would violate the pod's disruption "
        "budget.: The disruption budget web-pdb needs 2 healthy pods and has 2 currently",
        "evicted research/train-7b-0",
    ]
    assert fake_api.nodes[NODE]["spec"]["unschedulable"] is True
    assert "deletionTimestamp" not in fake_api.pods[("serving", "web-5d8f7-abcde")]["metadata"]
    assert not any(r.method == "DELETE" for r in fake_api.requests)


def test_signal_again_after_a_refusal_evicts_only_what_is_left(fake_api, scheduler):
    fake_api.add_node(make_node())
    fake_api.add_pod(make_pod("web-5d8f7-abcde", "serving", ("ReplicaSet", "web-5d8f7")))
    fake_api.add_pod(make_pod("train-7b-0"))
    fake_api.eviction_errors[("serving", "web-5d8f7-abcde")] = pdb_refusal("web-pdb")
    drain_and_evict(scheduler)
    del fake_api.eviction_errors[("serving", "web-5d8f7-abcde")]
    fake_api.requests.clear()

    output = drain_and_evict(scheduler)

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


def test_stop_deletes_a_pod_whose_budget_refuses_with_its_grace_period(fake_api, scheduler):
    fake_api.add_node(make_node())
    web = make_pod("web-5d8f7-abcde", "serving", ("ReplicaSet", "web-5d8f7"))
    web.spec.termination_grace_period_seconds = 45
    fake_api.add_pod(web)
    fake_api.add_pod(make_pod("train-7b-0"))
    fake_api.eviction_errors[("serving", "web-5d8f7-abcde")] = pdb_refusal("web-pdb")

    output = drain_and_evict(scheduler, stop=True)

    delete = next(r for r in fake_api.requests if r.method == "DELETE")
    assert delete.path == "/api/v1/namespaces/serving/pods/web-5d8f7-abcde"
    assert delete.body["gracePeriodSeconds"] == 45
    assert output.splitlines() == [
        f"cordoned {NODE}",
        "deleted serving/web-5d8f7-abcde with its 45 s grace period: the eviction was refused "
        "(pod serving/web-5d8f7-abcde: 429 Too Many Requests: Cannot evict pod as it would "
        "violate the pod's disruption budget.: The disruption budget web-pdb needs 2 healthy "
        "pods and has 2 currently)",
        "evicted research/train-7b-0",
    ]
    assert "deletionTimestamp" in fake_api.pods[("serving", "web-5d8f7-abcde")]["metadata"]


def test_drain_twice_cordons_once_and_signal_evicts_once(fake_api, scheduler):
    fake_api.add_node(make_node())
    fake_api.add_pod(make_pod("train-7b-0"))
    fake_api.add_pod(make_pod("train-7b-1"))

    drain_and_evict(scheduler)
    writes_after_first_drain = fake_api.writes()
    second_output = drain_and_evict(scheduler)
    fake_api.finish_terminating()
    third_output = drain_and_evict(scheduler)

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
    assert third_output.splitlines() == [f"{NODE} already cordoned",
                                         f"no workload pod on {NODE}"]


def test_drain_alone_cordons_and_evicts_nothing(fake_api, scheduler):
    fake_api.add_node(make_node())
    fake_api.add_pod(make_pod("train-7b-0"))

    assert scheduler.drain(NODE, REASON) == f"cordoned {NODE}"
    assert [r.method for r in fake_api.requests if r.method != "GET"] == ["PATCH"]


def test_signal_says_when_an_evicted_pod_has_no_controller(fake_api, scheduler):
    fake_api.add_node(make_node())
    fake_api.add_pod(make_pod("debug-shell", owner=None))

    output = drain_and_evict(scheduler)

    assert "evicted research/debug-shell (it has no controller: nothing recreates it)" in output


def test_node_is_drained_once_cordoned_and_its_workload_pods_are_gone(fake_api, scheduler):
    fake_api.add_node(make_node())
    fake_api.add_pod(make_pod("dcgm-exporter-x7k2p", "gpu-operator", ("DaemonSet", "dcgm")))
    fake_api.add_pod(make_pod("train-7b-0"))

    before = scheduler.node(NODE)
    drain_and_evict(scheduler)
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


def test_an_api_error_becomes_an_executor_error_with_status_and_reason(fake_api, scheduler):
    with pytest.raises(ExecutorError) as error:
        scheduler.drain("gpu-999", REASON)

    assert str(error.value) == 'reading node gpu-999: 404 Not Found: nodes "gpu-999" not found'


def test_an_eviction_failing_otherwise_raises(fake_api, scheduler):
    fake_api.add_node(make_node())
    fake_api.add_pod(make_pod("train-7b-0"))
    forbidden = 'pods "train-7b-0" is forbidden: cannot create pods/eviction'
    fake_api.eviction_errors[("research", "train-7b-0")] = (
        403,
        status_json(403, "Forbidden", forbidden),
    )

    with pytest.raises(ExecutorError) as error:
        drain_and_evict(scheduler)

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


def test_ping_lists_the_nodes_with_the_kubeconfigs_credentials(fake_api, tmp_path):
    fake_api.add_node(make_node())
    scheduler = from_kubeconfig(str(write_kubeconfig(fake_api, tmp_path / "kubeconfig")))
    assert scheduler.ping() == "the API server answered: 1 nodes"
    assert fake_api.requests[-1].authorization == "Bearer token-for-prod"


def test_ping_of_an_unreachable_api_server_says_so(tmp_path):
    nowhere = FakeKubernetesApi()
    nowhere.url = "http://127.0.0.1:9"
    scheduler = from_kubeconfig(str(write_kubeconfig(nowhere, tmp_path / "kubeconfig")))
    scheduler.request_timeout_s = 2
    with pytest.raises(ExecutorError, match="listing nodes"):
        scheduler.ping()
