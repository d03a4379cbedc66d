"""Kubernetes as a repair's scheduler, through the official `kubernetes` client.

drain:   cordon (spec.unschedulable, and the reason in the clusterui.io/drain-reason
         annotation): no new pods; those running stay.
signal:  evict the node's workload pods through the Eviction API, so PodDisruptionBudgets
         and each pod's terminationGracePeriodSeconds are honoured (the kubelet sends
         SIGTERM: Kubernetes has no other signal to give). A budget that refuses (429) is
         reported, not raised: the drain step asks again at its next check, up to its
         deadline.
stop:    the same evictions, and a pod whose budget refuses is deleted with its own grace
         period (a drain "now", or one past its deadline); the output names each.
resume:  uncordon and remove the annotation.
node:    kubectl's status ("Ready", "NotReady,SchedulingDisabled"); drained once the node
         is cordoned and no workload pod is left on it, terminating ones included.
running_jobs: the workload pods (see below), as Jobs.

Workload pods are the node's pods that have not finished, less DaemonSet pods (they belong
on every node and come back with it) and static pods (the kubelet's own, which the API
cannot evict). A pod without a controller is evicted too, but nothing recreates it: the
output says so.

A Job's user is the pod's `clusterui.io/user` label when it has one (a team's job templates
can set it), else the pod's service account as <namespace>/<service account>: Kubernetes
knows no person behind a pod, and the service account is the identity it runs as.
"""

import json
from datetime import datetime, timezone

import urllib3
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.config.config_exception import ConfigException

from .base import ExecutorError, Job, SchedulerNode

DRAIN_REASON_ANNOTATION = "clusterui.io/drain-reason"
USER_LABEL = "clusterui.io/user"
GPU_RESOURCE = "nvidia.com/gpu"
MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"
FINISHED_PHASES = ("Succeeded", "Failed")
REQUEST_TIMEOUT_S = 30


def from_kubeconfig(path=None, context=None):
    """A KubernetesScheduler for the console's cluster: from the kubeconfig file at `path`
    (its current context, or `context`), or, without a path, from the service account of
    the pod the console runs in."""
    try:
        if path is None:
            if context is not None:
                raise ExecutorError("a Kubernetes context needs a kubeconfig path")
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            api_client = client.ApiClient(configuration)
        else:
            # persist_config=False: never write refreshed credentials into the admin's file.
            api_client = config.new_client_from_config(
                config_file=path, context=context, persist_config=False
            )
    except ConfigException as error:
        raise ExecutorError(f"cannot load the Kubernetes configuration: {error}") from error
    return KubernetesScheduler(client.CoreV1Api(api_client))


class KubernetesScheduler:
    name = "kubernetes"
    drives_nodes = True
    jobs_end_on_their_own = False  # a Deployment's pod never ends: it has to be evicted

    def __init__(self, core_api, request_timeout_s=REQUEST_TIMEOUT_S):
        self.core_api = core_api
        self.request_timeout_s = request_timeout_s

    def drain(self, node_name, reason):
        node = self._call(f"reading node {node_name}", self.core_api.read_node, node_name)
        if node.spec.unschedulable and _annotations(node).get(DRAIN_REASON_ANNOTATION) == reason:
            return f"{node_name} already cordoned"
        patch = {
            "spec": {"unschedulable": True},
            "metadata": {"annotations": {DRAIN_REASON_ANNOTATION: reason}},
        }
        self._call(f"cordoning {node_name}", self.core_api.patch_node, node_name, patch)
        return f"cordoned {node_name}"

    def ping(self):
        """That the API server answers these credentials: the nodes it lists."""
        nodes = self._call("listing nodes", self.core_api.list_node, limit=500)
        return f"the API server answered: {len(nodes.items)} nodes"

    def signal(self, node_name, jobs, signal, all_steps=False):
        """Evict the node's workload pods, as far as their disruption budgets allow now."""
        return self._evict_workload(node_name, delete_refused=False)

    def stop(self, node_name, jobs):
        """Evict the node's workload pods; delete, with its grace period, each pod whose
        disruption budget refuses."""
        return self._evict_workload(node_name, delete_refused=True)

    def _evict_workload(self, node_name, delete_refused):
        lines, refusals = [], []
        for pod in self._pods_on(node_name):
            pod_id = _pod_id(pod)
            if _is_daemonset_pod(pod):
                lines.append(f"left {pod_id} (DaemonSet)")
            elif _is_static_pod(pod):
                lines.append(f"left {pod_id} (static pod)")
            elif _is_finished(pod):
                continue
            elif pod.metadata.deletion_timestamp is not None:
                lines.append(f"{pod_id} is terminating")
            else:
                evicted, message = self._evict(pod)
                if evicted:
                    lines.append(message)
                elif delete_refused:
                    lines.append(self._delete(pod, refused=message))
                else:
                    refusals.append(message)
        if refusals:
            lines.insert(0, "cannot evict yet (asked again at the next check): "
                            + "; ".join(refusals))
        return "\n".join(lines) or f"no workload pod on {node_name}"

    def resume(self, node_name):
        node = self._call(f"reading node {node_name}", self.core_api.read_node, node_name)
        if not node.spec.unschedulable and DRAIN_REASON_ANNOTATION not in _annotations(node):
            return f"{node_name} already schedulable"
        # In a strategic merge patch, null deletes the key.
        patch = {
            "spec": {"unschedulable": False},
            "metadata": {"annotations": {DRAIN_REASON_ANNOTATION: None}},
        }
        self._call(f"uncordoning {node_name}", self.core_api.patch_node, node_name, patch)
        return f"uncordoned {node_name}"

    def node(self, node_name):
        node = self._call(f"reading node {node_name}", self.core_api.read_node, node_name)
        ready = "Unknown"
        for condition in (node.status and node.status.conditions) or []:
            if condition.type == "Ready":
                ready = condition.status
        state = {"True": "Ready", "False": "NotReady"}.get(ready, "Unknown")
        cordoned = bool(node.spec.unschedulable)
        if cordoned:
            state += ",SchedulingDisabled"
        drained = cordoned and not any(_is_workload(pod) for pod in self._pods_on(node_name))
        reason = _annotations(node).get(DRAIN_REASON_ANNOTATION, "")
        return SchedulerNode(state=state, drained=drained, reason=reason)

    def running_jobs(self, node_name):
        now = datetime.now(timezone.utc)
        return [_job(pod, now) for pod in self._pods_on(node_name) if _is_workload(pod)]

    def _pods_on(self, node_name):
        pod_list = self._call(
            f"listing the pods on {node_name}",
            self.core_api.list_pod_for_all_namespaces,
            field_selector=f"spec.nodeName={node_name}",
        )
        return pod_list.items

    def _evict(self, pod):
        """(True, what happened): evicted, or already gone. (False, why): the API refuses
        for now (429), a disruption budget that allows no more disruptions at the moment."""
        pod_id = _pod_id(pod)
        eviction = client.V1Eviction(
            api_version="policy/v1",
            kind="Eviction",
            metadata=client.V1ObjectMeta(name=pod.metadata.name, namespace=pod.metadata.namespace),
        )
        try:
            self.core_api.create_namespaced_pod_eviction(
                pod.metadata.name,
                pod.metadata.namespace,
                eviction,
                _request_timeout=self.request_timeout_s,
            )
        except ApiException as error:
            if error.status == 404:
                return True, f"{pod_id} already gone"
            if error.status == 429:
                return False, f"pod {pod_id}: {_describe_api_error(error)}"
            raise ExecutorError(f"evicting pod {pod_id}: {_describe_api_error(error)}") from error
        except urllib3.exceptions.HTTPError as error:
            raise ExecutorError(f"evicting pod {pod_id}: {_unreachable(error)}") from error
        if _controller(pod) is None:
            return True, f"evicted {pod_id} (it has no controller: nothing recreates it)"
        return True, f"evicted {pod_id}"

    def _delete(self, pod, refused):
        """Delete a pod whose eviction was refused, with its own grace period."""
        pod_id = _pod_id(pod)
        grace_s = pod.spec.termination_grace_period_seconds
        try:
            self.core_api.delete_namespaced_pod(
                pod.metadata.name, pod.metadata.namespace,
                body=client.V1DeleteOptions(grace_period_seconds=grace_s),
                _request_timeout=self.request_timeout_s)
        except ApiException as error:
            if error.status == 404:
                return f"{pod_id} already gone"
            raise ExecutorError(f"deleting pod {pod_id}: {_describe_api_error(error)}") from error
        except urllib3.exceptions.HTTPError as error:
            raise ExecutorError(f"deleting pod {pod_id}: {_unreachable(error)}") from error
        grace = "its default grace period" if grace_s is None else f"its {grace_s} s grace period"
        return f"deleted {pod_id} with {grace}: the eviction was refused ({refused})"

    def _call(self, what, method, *args, **kwargs):
        try:
            return method(*args, _request_timeout=self.request_timeout_s, **kwargs)
        except ApiException as error:
            raise ExecutorError(f"{what}: {_describe_api_error(error)}") from error
        except urllib3.exceptions.HTTPError as error:
            raise ExecutorError(f"{what}: {_unreachable(error)}") from error


def _describe_api_error(error):
    """'429 Too Many Requests: <the Status message>: <its causes>' from an ApiException."""
    text = f"{error.status} {error.reason}"
    try:
        status = json.loads(error.body)
    except (TypeError, ValueError):
        return text
    if not isinstance(status, dict):
        return text
    details = [status.get("message", "")]
    for cause in (status.get("details") or {}).get("causes") or []:
        details.append(cause.get("message", ""))
    return ": ".join([text] + [detail for detail in details if detail])


def _unreachable(error):
    return f"cannot reach the Kubernetes API server ({error})"


def _annotations(obj):
    return obj.metadata.annotations or {}


def _pod_id(pod):
    return f"{pod.metadata.namespace}/{pod.metadata.name}"


def _controller(pod):
    for owner in pod.metadata.owner_references or []:
        if owner.controller:
            return owner
    return None


def _is_daemonset_pod(pod):
    return any(owner.kind == "DaemonSet" for owner in pod.metadata.owner_references or [])


def _is_static_pod(pod):
    return MIRROR_POD_ANNOTATION in _annotations(pod)


def _is_finished(pod):
    return pod.status is not None and pod.status.phase in FINISHED_PHASES


def _is_workload(pod):
    return not (_is_daemonset_pod(pod) or _is_static_pod(pod) or _is_finished(pod))


def _job(pod, now):
    labels = pod.metadata.labels or {}
    user = labels.get(USER_LABEL) or (
        f"{pod.metadata.namespace}/{pod.spec.service_account_name or 'default'}"
    )
    controller = _controller(pod)
    gpus = 0
    for container in pod.spec.containers:
        limits = (container.resources and container.resources.limits) or {}
        gpus += int(limits.get(GPU_RESOURCE, 0))
    start_time = pod.status and pod.status.start_time
    return Job(
        id=_pod_id(pod),
        user=user,
        name=f"{controller.kind}/{controller.name}" if controller else "",
        gpus=gpus,
        run_time_s=int((now - start_time).total_seconds()) if start_time else None,
        account=pod.metadata.namespace,
        nodes=(pod.spec.node_name,) if pod.spec.node_name else (),
    )
