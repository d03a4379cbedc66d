"""A reboot repair through real Slurm (tests/slurm.py: slurmctld, slurmdbd, slurmds
gpu-001..gpu-004 with 8 fake GPUs each) and real processes: daphne, the simulated agent of
gpu-001, a Celery worker and beat.

An operator proposes a reboot of gpu-001 while a batch job runs there and approves it: the
drain step drains gpu-001 in Slurm (MIXED+DRAIN, the job runs on), waits the grace period,
requeues the job (it starts again on another node), then the agent reboots (new boot id),
the checks pass, and Slurm resumes gpu-001: idle, not drained, the job restarted once.
"""

import time

import pytest

from clusters.models import Cluster
from clusters.roles import Role
from clusters.tests.factories import ClusterFactory, UserFactory
from nodes.choices import NodeState
from nodes.models import AgentCommand, Node
from nodes.services import do_issue_join_token
from repairs.choices import Status, StepStatus
from schedulers.slurm import parse_node_line
from repairs.models import Repair, RepairPolicy, RepairSettings
from repairs.services import do_approve_repair, do_propose_repair

from .integration import wait_until
from .test_live_integration import joined_node

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

GRACE_S = 5


@pytest.fixture
def stack(processes):
    # A node counts as booting for CLUSTERUI_BOOT_WINDOW_S after a hello; not here.
    processes.env.update(CLUSTERUI_BOOT_WINDOW_S="0")
    return processes


def slurm_node(slurm, name):
    """`scontrol show node <name> -o` as {field: value}."""
    return parse_node_line(slurm.run(["scontrol", "show", "node", name, "-o"]).stdout)


def job_fields(slurm, job_id):
    """`scontrol show job <id> -o` as {field: value} (only the single-word values matter)."""
    fields = {}
    for item in slurm.run(["scontrol", "show", "job", job_id, "-o"]).stdout.split():
        key, _, value = item.partition("=")
        fields.setdefault(key, value)
    return fields


def accounting_records(slurm, job_id):
    """sacct's records of the job, one per run (-D: a requeued run is kept as REQUEUED):
    [(state, node list)]."""
    result = slurm.run(["sacct", "-j", job_id, "-D", "-X", "-n", "-P", "-o", "State,NodeList"])
    return [tuple(line.split("|")) for line in result.stdout.splitlines() if line.strip()]


def test_a_reboot_drains_requeues_the_running_job_reboots_and_resumes_in_slurm(stack, slurm):
    cluster = ClusterFactory(name="int-slurm-repair", slug="int-slurm-repair")
    Cluster.objects.filter(pk=cluster.pk).update(scheduler="slurm",
                                                 scheduler_config=str(slurm.slurm_conf))
    RepairSettings.objects.create(cluster=cluster, provider="simulated")
    # A repair proposed by hand waits GRACE_S for the jobs, then requeues them.
    RepairPolicy.objects.create(cluster=cluster, signature="manual", drain_mode="after_jobs",
                                drain_deadline_s=GRACE_S, drain_at_deadline="go_on")
    _, join_token = do_issue_join_token(cluster)
    server = stack.daphne()
    worker = stack.celery("worker", "--concurrency=1", "-P", "solo", "--without-heartbeat",
                          "--without-gossip", "--without-mingle")
    stack.celery("beat", "-s", stack.directory / "beat-schedule", "--max-interval", "1")
    # The console's node and the Slurm node share the name gpu-001.
    agent = stack.agent("gpu-001", server, token=join_token, extra_args=["--simulated-boot", "2"])
    node = joined_node(cluster, "gpu-001", agent=agent)
    boot_before = node.boot_id

    # On an idle cluster Slurm places a one-node job on the first node, gpu-001; no
    # --nodelist, which would keep the requeued job waiting for gpu-001 again.
    job = slurm.sbatch("sleep 600", gres="gpu:2", name="train")
    slurm.wait_job_state(job, "RUNNING")
    assert slurm.job_node(job) == "gpu-001"
    wait_until(lambda: worker.check_running() or " ready." in worker.log_text(),
               timeout=30, what="the Celery worker is ready")

    operator = UserFactory(username="int-olga", role=Role.OPERATOR)
    repair = do_propose_repair(node, action="reboot", actor=operator,
                               reason="flaky NVLink after the firmware update")
    reviewer = UserFactory(username="int-rita", role=Role.OPERATOR)
    do_approve_repair(repair, actor=reviewer, comment="go")

    # Drained while the job runs on: MIXED+DRAIN with this repair's reason.
    fields = wait_until(
        lambda: (lambda f: f if f.get("State") == "MIXED+DRAIN" else None)(
            slurm_node(slurm, "gpu-001")),
        timeout=15, what="gpu-001 MIXED+DRAIN in Slurm")
    drained_at = time.monotonic()
    assert fields["Reason"] == f"clusterui repair #{repair.pk}"
    # The step records its wait just after the drain; the job is left alone for the grace.
    waiting = repair.steps.filter(kind="drain", status=StepStatus.WAITING)
    drain = wait_until(waiting.first, timeout=10, what="the drain step waits")
    assert "drained; waiting for 1 job(s) to end" in drain.message
    assert (slurm.job_state(job), slurm.job_node(job)) == ("RUNNING", "gpu-001")

    # After the grace period the job is requeued and leaves gpu-001: it starts again on
    # another node at once (the step skips Slurm's requeue delay).
    wait_until(lambda: slurm.job_node(job) not in {"", "gpu-001"}
               and slurm.job_state(job) == "RUNNING",
               timeout=40, what="the job runs again on another node")
    assert time.monotonic() - drained_at >= GRACE_S - 1  # 1 s: the drain was seen late

    def finished():
        agent.check_running()
        worker.check_running()
        return Repair.objects.filter(pk=repair.pk, status__in=[Status.SUCCEEDED,
                                                               Status.FAILED]).first()

    repair = wait_until(finished, timeout=60, what="the repair finishes")
    steps = list(repair.steps.order_by("position"))
    assert repair.status == Status.SUCCEEDED, [(s.kind, s.status, s.message) for s in steps]
    assert [s.kind for s in steps] == ["drain", "collect_bundle", "act", "wait_for_node",
                                       "verify", "resume"]
    assert all(s.status == StepStatus.DONE for s in steps)
    assert f"requeued {job}; pending to start now: {job}" in steps[0].output
    assert steps[-1].output == "resumed gpu-001 (was IDLE+DRAIN)"

    # Slurm: gpu-001 back in service, idle (the job stayed where it restarted), not drained.
    wait_until(lambda: slurm.node_states()["gpu-001"] == "idle", timeout=10,
               what="gpu-001 idle in Slurm")
    fields = slurm_node(slurm, "gpu-001")
    assert fields["State"] == "IDLE" and "Reason" not in fields
    # The job was requeued once: one restart, one requeued run on gpu-001 in accounting.
    assert job_fields(slurm, job)["Restarts"] == "1"
    runs = wait_until(lambda: (lambda r: r if len(r) == 2 else None)(
        accounting_records(slurm, job)), timeout=15, what="sacct lists both runs of the job")
    assert runs[0] == ("REQUEUED", "gpu-001")
    assert runs[1][0] == "RUNNING" and runs[1][1] != "gpu-001"

    # The console: rebooted (new boot id) through one agent command, healthy.
    node = Node.objects.get(pk=node.pk)
    assert node.boot_id != boot_before
    [command] = AgentCommand.objects.filter(node=node, action="reboot")
    assert command.status == "ok"
    wait_until(lambda: Node.objects.get(pk=node.pk).state == NodeState.HEALTHY, timeout=10,
               what="the console shows gpu-001 healthy")
    assert list(repair.transitions.values_list("to_status", flat=True)) == [
        "approved", "running", "succeeded"]
