"""Issue 5's reliability tests over real processes and real Slurm: a Celery worker killed in
the middle of a repair step, then the repair finished by the restarted worker with no side
effect twice; and a failed step that fails the repair and leaves the node paused.

Side effects are counted where they happen:
- Slurm: the worker finds a counting `scontrol` first on its PATH (written by the test): it
  logs every call and runs the real /usr/bin/scontrol. The first call that matches `hold`
  holds afterwards until its caller is gone: the worker dies while the step is "inside"
  scontrol, after Slurm applied the change but before the step heard back. That is the
  case that could do it twice: the step's second run must see the drain (or resume) that
  already happened and not ask again. (A kill before the call would leave nothing to
  repeat; a kill during it races the orphaned scontrol with the second run.)
- The agent: AgentCommand rows of the node, and the reboots in the agent's own log.

The worker is prefork with one pool process, as deployed: `-P prefork -c 1`.
"""

import os
import shlex
import signal
import time
from pathlib import Path

import psutil
import pytest
from celery import current_app
from django.utils import timezone

from clusters.models import Cluster
from clusters.roles import Role
from clusters.tests.factories import ClusterFactory, UserFactory
from nodes.choices import NodeState
from nodes.models import AgentCommand, Node
from nodes.services import do_issue_join_token
from repairs.choices import Status, StepStatus
from repairs.models import Repair, RepairPolicy, RepairSettings, RepairStep
from repairs.services import RUN_STEP_TASK, do_approve_repair, do_propose_repair

from .integration import wait_until
from .test_live_integration import joined_node

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

REAL_SCONTROL = "/usr/bin/scontrol"
# For the whole-worker kill: a task taken by a dead worker is back in the queue this long
# after it was delivered (the Redis transport's visibility timeout; 600 s by default).
VISIBILITY_TIMEOUT_S = 5
# What the agent logs once per reboot (agent/sim/boot.py SimulatedReboot).
AGENT_REBOOT_LINE = "simulated reboot of gpu-001"


class CountingScontrol:
    """`bin/scontrol` in `directory`: logs each call's arguments to scontrol.log, runs the
    real one, and after the first call containing `hold` (if given) writes its caller's
    pid to held.pid and waits until that process is gone (at most 20 s)."""

    def __init__(self, directory, hold=None):
        directory = Path(directory)
        self.bin = directory / "bin"
        self.log = directory / "scontrol.log"
        self.held = directory / "held.pid"
        self.bin.mkdir()
        q = shlex.quote
        hold_block = ""
        if hold:
            # mkdir is atomic: only the first matching call holds.
            hold_block = f"""
case "$*" in
    *{q(hold)}*)
        if mkdir {q(str(directory / "held.lock"))} 2>/dev/null; then
            echo $PPID > {q(str(self.held))}.tmp && mv {q(str(self.held))}.tmp {q(str(self.held))}
            i=0
            while [ $i -lt 200 ] && kill -0 $PPID 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
        fi;;
esac"""
        script = self.bin / "scontrol"
        script.write_text(f"""#!/bin/sh
printf '%s\\n' "$*" >> {q(str(self.log))}
{REAL_SCONTROL} "$@"
status=$?{hold_block}
exit $status
""")
        script.chmod(0o755)

    def calls(self):
        return self.log.read_text().splitlines() if self.log.exists() else []

    def updates(self):
        """The calls that change Slurm's state."""
        return [c for c in self.calls() if c.startswith(("update", "requeue"))]

    def held_pid(self):
        """The pid of the process waiting in the held call, once it is held."""
        return int(self.held.read_text()) if self.held.exists() else None


@pytest.fixture
def stack(processes):
    # A node counts as booting for CLUSTERUI_BOOT_WINDOW_S after a hello; not here.
    processes.env.update(CLUSTERUI_BOOT_WINDOW_S="0")
    return processes


def start_worker(stack, scontrol, **env):
    worker = stack.celery("worker", "-P", "prefork", "-c", "1", "--without-heartbeat",
                          "--without-gossip", "--without-mingle",
                          PATH=f"{scontrol.bin}:{stack.env['PATH']}", **env)

    def ready():
        worker.check_running()
        # The log is appended to across restarts: look at this start's part only.
        return " ready." in worker.log_text().rpartition(" start: ")[2]

    wait_until(ready, timeout=30, what="the Celery worker is ready")
    return worker


def deploy(stack, slurm, scontrol, node_name="gpu-001", **worker_env):
    """A cluster repaired through Slurm and the simulated provider, daphne, the agent of
    `node_name`, a worker (with the counting scontrol) and beat. (node, agent, worker)."""
    cluster = ClusterFactory(name="int-reliable", slug="int-reliable")
    Cluster.objects.filter(pk=cluster.pk).update(scheduler="slurm",
                                                 scheduler_config=str(slurm.slurm_conf))
    RepairSettings.objects.create(cluster=cluster, provider="simulated")
    # A repair proposed by hand waits 5 s for the jobs, then requeues them.
    RepairPolicy.objects.create(cluster=cluster, signature="manual", drain_mode="after_jobs",
                                drain_deadline_s=5, drain_at_deadline="go_on")
    _, join_token = do_issue_join_token(cluster)
    server = stack.daphne()
    stack.celery("beat", "-s", stack.directory / "beat-schedule", "--max-interval", "1")
    agent = stack.agent(node_name, server, token=join_token,
                        extra_args=["--simulated-boot", "2"])
    worker = start_worker(stack, scontrol, **worker_env)
    node = joined_node(cluster, node_name, agent=agent)
    return node, agent, worker


def propose_and_approve(node):
    operator = UserFactory(username="int-oscar", role=Role.OPERATOR)
    repair = do_propose_repair(node, action="reboot", actor=operator, reason="testing")
    return do_approve_repair(repair, actor=operator, comment="go")


def wait_finished(repair, *processes, timeout):
    def finished():
        for process in processes:
            process.check_running()
        return Repair.objects.filter(pk=repair.pk, status__in=[Status.SUCCEEDED,
                                                               Status.FAILED]).first()

    return wait_until(finished, timeout=timeout, what=f"repair #{repair.pk} finishes")


def assert_repaired_once(repair, node, agent, scontrol, slurm):
    """Succeeded; Slurm drained and resumed gpu-001 once each; the agent rebooted once."""
    steps = list(repair.steps.order_by("position"))
    assert repair.status == Status.SUCCEEDED, [(s.kind, s.status, s.message) for s in steps]
    assert all(s.status == StepStatus.DONE for s in steps)
    assert scontrol.updates() == [
        f"update nodename=gpu-001 state=drain reason=clusterui repair #{repair.pk}",
        "update nodename=gpu-001 state=resume",
    ]
    [command] = AgentCommand.objects.filter(node=node, action="reboot")
    assert command.status == "ok"
    assert agent.log_text().count(AGENT_REBOOT_LINE) == 1
    wait_until(lambda: slurm.node_states()["gpu-001"] == "idle", timeout=10,
               what="gpu-001 idle in Slurm")
    wait_until(lambda: Node.objects.get(pk=node.pk).state == NodeState.HEALTHY, timeout=10,
               what="the console shows gpu-001 healthy")


def test_a_pool_process_killed_inside_the_drain_gets_its_step_run_again_without_a_second_drain(
        stack, slurm):
    scontrol = CountingScontrol(stack.directory, hold="nodename=gpu-001 state=drain")
    node, agent, worker = deploy(stack, slurm, scontrol)
    [pool_process] = worker.children()

    repair = propose_and_approve(node)

    # The drain step is inside scontrol: Slurm has drained gpu-001, the step has not heard.
    held = wait_until(scontrol.held_pid, timeout=20, what="the drain's scontrol call holds")
    assert held == pool_process.pid
    assert slurm.node_states()["gpu-001"] == "drain"
    os.kill(pool_process.pid, signal.SIGKILL)

    repair = wait_finished(repair, worker, agent, timeout=60)
    # The worker lived on with a new pool process, which ran the step again
    # (reject_on_worker_lost put the task back in the queue).
    assert "signal 9 (SIGKILL)" in worker.log_text()
    assert [p.pid for p in worker.children()] != [pool_process.pid]
    assert repair.steps.get(kind="drain").attempts == 2
    assert_repaired_once(repair, node, agent, scontrol, slurm)


def test_a_worker_killed_whole_inside_the_resume_is_replaced_and_the_repair_finishes(
        stack, slurm):
    scontrol = CountingScontrol(stack.directory, hold="nodename=gpu-001 state=resume")
    node, agent, worker = deploy(stack, slurm, scontrol,
                                 CELERY_VISIBILITY_TIMEOUT_S=VISIBILITY_TIMEOUT_S)

    repair = propose_and_approve(node)

    # Drained, rebooted, verified; the resume step is inside scontrol: gpu-001 is back in
    # service in Slurm, the step has not heard.
    held = wait_until(scontrol.held_pid, timeout=60, what="the resume's scontrol call holds")
    assert held in [p.pid for p in worker.children()]
    wait_until(lambda: slurm.node_states()["gpu-001"] in ("idle", "idle*"), timeout=5,
               what="gpu-001 resumed in Slurm")
    worker.kill_tree()
    killed_at = time.monotonic()
    assert not psutil.pid_exists(held)
    assert repair.steps.get(kind="resume").status == StepStatus.RUNNING

    # The task is in Redis as taken by the dead worker; a worker takes it back once the
    # visibility timeout has passed. It checks at start: start it after the timeout.
    time.sleep(max(0.0, killed_at + VISIBILITY_TIMEOUT_S + 1 - time.monotonic()))
    assert Repair.objects.get(pk=repair.pk).status == Status.RUNNING
    worker = start_worker(stack, scontrol, CELERY_VISIBILITY_TIMEOUT_S=VISIBILITY_TIMEOUT_S)

    repair = wait_finished(repair, worker, agent, timeout=30)
    assert repair.steps.get(kind="resume").attempts == 2
    assert_repaired_once(repair, node, agent, scontrol, slurm)


def test_a_failed_drain_fails_the_repair_with_slurms_reason_and_leaves_the_node_paused(
        stack, slurm):
    # gpu-009 has an agent and a place in the console, but Slurm does not know it.
    scontrol = CountingScontrol(stack.directory)
    node, agent, worker = deploy(stack, slurm, scontrol, node_name="gpu-009")

    repair = propose_and_approve(node)

    repair = wait_finished(repair, worker, agent, timeout=30)
    why = "scontrol show node gpu-009 -o exited with status 1: Node gpu-009 not found"
    assert repair.status == Status.FAILED
    assert repair.outcome == f"drain failed: {why}"
    steps = list(repair.steps.order_by("position"))
    assert [(s.kind, s.status) for s in steps] == [
        ("drain", "failed"), ("collect_bundle", "pending"), ("act", "pending"),
        ("wait_for_node", "pending"), ("verify", "pending"), ("resume", "pending")]
    assert steps[0].message == why
    assert list(repair.transitions.values_list("to_status", flat=True)) == [
        "approved", "running", "failed"]

    node = Node.objects.get(pk=node.pk)
    assert node.paused
    assert node.paused_reason == f"repair #{repair.pk} failed: drain failed: {why}"
    assert node.state == NodeState.PAUSED
    # Nothing was changed: no Slurm update, no reboot.
    assert scontrol.calls() == ["show node gpu-009 -o"]
    assert not AgentCommand.objects.filter(node=node).exists()
    assert AGENT_REBOOT_LINE.replace("gpu-001", "gpu-009") not in agent.log_text()


def test_a_step_delivered_many_times_at_once_to_several_workers_acts_once(stack, tmp_path):
    """Two worker processes of four pool processes each get the act step of a reprovision
    eight times at once (a beat tick, a retry, a duplicate): the provider's command, which
    takes a second, runs once."""
    calls = tmp_path / "provider-calls"
    cluster = ClusterFactory(name="int-dup", slug="int-dup")
    RepairSettings.objects.create(cluster=cluster, provider="command", provider_commands={
        "reprovision": f"sleep 1; echo {{node}} >> {calls}"})
    node = Node.objects.create(cluster=cluster, name="gpu-001", joined_at=timezone.now(),
                               last_hello_at=timezone.now(), boot_id="boot-1")
    operator = UserFactory(username="int-dup-op", role=Role.OPERATOR)
    repair = do_approve_repair(do_propose_repair(node, action="reprovision", actor=operator,
                                                 reason="test"), actor=operator)
    # The drain is done (no scheduler), and the bundle step (no agent here): the act step
    # is next, pending, not yet sent.
    steps = list(repair.steps.order_by("position"))
    RepairStep.objects.filter(pk__in=[steps[0].pk, steps[1].pk]).update(
        status=StepStatus.DONE, finished_at=timezone.now())
    steps = [step for step in steps if step.kind != "collect_bundle"]
    workers = [stack.celery("worker", "-P", "prefork", "-c", "4", "-n", f"dup{n}@%h",
                            "--without-heartbeat", "--without-gossip", "--without-mingle")
               for n in range(2)]
    for worker in workers:
        wait_until(lambda w=worker: w.check_running() or " ready." in w.log_text(),
                   timeout=60, what="the Celery worker is ready")

    for _ in range(8):
        current_app.send_task(RUN_STEP_TASK, args=[steps[1].pk])

    act = wait_until(lambda: RepairStep.objects.filter(pk=steps[1].pk,
                                                       status=StepStatus.DONE).first(),
                     timeout=60, what="the act step is done")

    def finished_deliveries():  # Celery's "Task ...[id] succeeded in" (or raised, retry) lines
        return sum("run_repair_step[" in line and " received" not in line
                   for worker in workers for line in worker.log_text().splitlines())

    wait_until(lambda: finished_deliveries() >= 8, timeout=30,
               what="the other seven deliveries have had their turn")
    assert calls.read_text() == "gpu-001\n"
    assert act.attempts == 1
    received = sum(worker.log_text().count("run_repair_step[") for worker in workers)
    assert received >= 8, "each delivery reached a worker"
