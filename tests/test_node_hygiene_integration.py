"""Node hygiene end to end (issue 17): daphne, a Celery worker and beat, the real agent of
hyg-e2e (simulated GPUs, `--hygiene`: its watchers on this machine's real processes and
Slurm daemons) and a real Slurm cluster of its own (tests/slurm.py: these tests kill
slurmd and break gres.conf), whose Epilog is the agent's hook.

- A job forks a `setsid` daemon and writes to /dev/shm; when it ends the Epilog ends the
  daemon (found by /proc: the cluster tracks processes with proctrack/linuxproc) and removes
  the file, and the cleanup shows on the node page.
- Zombies made by a test program are reported with their parent; an operator's clean-up
  has the agent signal the parent, which reaps them, and the result shows.
- A killed slurmd is restarted in place; the third kill in a row opens slurmd_flapping,
  and a reboot is recommended.
- A gres.conf one GPU short opens gres_drift; approving the recommended reconfigure makes
  `scontrol show node` match again.
"""

import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse

from clusters.roles import Role
from clusters.tests.factories import ClusterFactory, UserFactory
from healthchecks.models import HealthEvent
from nodes.models import AgentCommand
from nodes.services import do_issue_join_token
from repairs.choices import Status
from repairs.models import Repair
from repairs.services import do_approve_repair

from .browser import REPO_ROOT
from .integration import wait_until
from .slurm import SlurmCluster, missing_requirements, wait_for
from .test_live_integration import joined_node

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

NODE = "hyg-e2e"
USER = "hygiene-e2e"
GRACE_S = 1


@pytest.fixture(scope="module")
def cluster():
    lacking = missing_requirements()
    if lacking:
        pytest.skip(f"a real Slurm cluster needs {lacking}")
    directory = Path(tempfile.mkdtemp(prefix="clusterui-hygiene-e2e.", dir="/tmp"))
    cluster = SlurmCluster(directory, nodes=[NODE], accounting=False)
    try:
        cluster.start()
        cluster.add_user(USER)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(directory, ignore_errors=True)


@dataclass
class Stack:
    processes: object  # tests.integration.ProcessGroup
    state_dir: Path  # the agent's: the Epilog hook spools its reports there
    agent_args: list


@pytest.fixture
def stack(processes, cluster, tmp_path):
    """The console's processes, with the agent's settings for this cluster: its Epilog is
    the hook, its slurmd's pid file and restart command, its gres.conf and device files."""
    processes.env.update(CLUSTERUI_BOOT_WINDOW_S="0", SLURM_CONF=str(cluster.slurm_conf))
    state_dir = tmp_path / "agent-state"
    state_dir.mkdir()
    config = tmp_path / "agent.toml"
    config.write_text(f"job_cleanup_grace = {GRACE_S}\n")
    epilog = tmp_path / "epilog.sh"
    epilog.write_text(f"#!/bin/sh\nexport SLURM_CONF={cluster.slurm_conf}\ncd {REPO_ROOT}\n"
                      f"exec {sys.executable} -m agent hook job-end --state-dir {state_dir} "
                      f"--config {config}\n")
    epilog.chmod(0o755)
    gres_conf = cluster.etc / "gres.conf"
    original_gres = gres_conf.read_text()
    cluster.set_conf(Epilog=str(epilog))
    agent_args = [
        "--hygiene", "--slurmd-pid-file", str(cluster.directory / "run" / f"slurmd-{NODE}.pid"),
        "--slurmd-restart-command", f"slurmd -N {NODE}", "--zombie-threshold", "3",
        "--process-check-interval", "1", "--gres-conf", str(gres_conf),
        "--gpu-device-dir", str(cluster.directory / "dev"), "--gres-check-interval", "10",
        "--job-cleanup-grace", str(GRACE_S)]
    yield Stack(processes, state_dir, agent_args)
    processes.stop_all()  # the agent first: it would restart the slurmd stopped below
    gres_conf.write_text(original_gres)
    daemon = cluster.daemons[f"slurmd {NODE}"]
    daemon.stop()
    cluster.stop_restarted_slurmd(NODE)
    daemon.start()
    wait_for(lambda: "INVALID" not in node_line(cluster), timeout=30,
             what=f"{NODE} registered again", alive=[daemon])
    cluster.reset()
    cluster.set_conf(Epilog=None)


def node_line(cluster):
    return cluster.run(["scontrol", "show", "node", NODE, "-o"]).stdout


def start_console(stack):
    """daphne, a Celery worker and beat, and the agent of NODE, joined: (cluster, node)."""
    console = ClusterFactory(name="int-hygiene", slug="int-hygiene")
    _, join_token = do_issue_join_token(console)
    processes = stack.processes
    server = processes.daphne()
    processes.celery("worker", "--concurrency=1", "-P", "solo", "--without-heartbeat",
                     "--without-gossip", "--without-mingle")
    processes.celery("beat", "-s", processes.directory / "beat-schedule", "--max-interval", "1")
    agent = processes.agent(NODE, server, token=join_token, state_dir=stack.state_dir,
                            extra_args=stack.agent_args)
    return console, joined_node(console, NODE, agent=agent)


def operator_client(console):
    client = Client()
    client.force_login(UserFactory(username="olga", role=Role.OPERATOR))
    return client


def node_page(client, console, node):
    return client.get(reverse("nodes:detail", args=[console.slug, node.name])).content.decode()


def events(node, signature, **filters):
    return list(HealthEvent.objects.filter(node=node, signature=signature, **filters)
                .order_by("id"))


def process_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


ZOMBIE_MAKER = textwrap.dedent("""
    import os, signal, sys, time
    children = [os.fork() or os._exit(0) for _ in range(4)]
    time.sleep(0.5)  # they exit: zombies, as nothing waits for them

    def reap(signum, frame):  # what a well-behaved parent does on SIGCHLD
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    return
            except ChildProcessError:
                return

    signal.signal(signal.SIGCHLD, reap)
    print("ready", flush=True)
    time.sleep(300)
""")


def test_job_leftovers_zombies_and_a_flapping_slurmd(stack, cluster):
    console, node = start_console(stack)
    client = operator_client(console)
    wait_until(lambda: "<strong>running</strong>" in node_page(client, console, node),
               timeout=30, what="slurmd's state on the node page")

    # A job leaves a daemon out of its session and a /dev/shm file behind.
    uid = pwd.getpwnam(USER).pw_uid
    shm_file = Path(f"/dev/shm/clusterui-e2e-{uid}-{os.getpid()}")
    marker = cluster.jobs_dir / f"daemon-{os.getpid()}.pid"
    job = cluster.sbatch(f"setsid -f sh -c 'echo $$ > {marker}; exec sleep 300'; "
                         f"echo data > {shm_file}; sleep 1", user=USER, nodelist=NODE)
    wait_until(lambda: events(node, "job_cleanup"), timeout=60, what="the job's cleanup notice")
    daemon_pid = int(marker.read_text())
    (notice,) = events(node, "job_cleanup")
    report = notice.evidence
    assert (report["job_id"], report["user"], report["method"]) == (job, USER, "proc")
    assert report["found"] >= 1 and daemon_pid in report["ended"] + report["killed"]
    assert not process_alive(daemon_pid) and not shm_file.exists()
    assert str(shm_file) in [entry["path"] for entry in report["shm_removed"]]
    assert notice.closed_at is not None  # a notice, not a condition
    page = node_page(client, console, node)
    row = page[page.index('id="job-cleanups"'):]
    assert f'<td class="mono">{job}</td><td>{USER}</td>' in row and "<td>proc</td>" in row

    # Zombies, with their parent; the operator's clean-up has the agent signal it.
    maker = subprocess.Popen([sys.executable, "-c", ZOMBIE_MAKER], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert maker.stdout.readline().strip() == "ready"
        wait_until(lambda: events(node, "zombie_processes", closed_at__isnull=True),
                   timeout=30, what="zombie_processes")
        (zombies,) = events(node, "zombie_processes")
        parents = {p["ppid"] for p in zombies.evidence["processes"]}
        assert maker.pid in parents
        assert f"({maker.pid}) {sys.executable} -c" in node_page(client, console, node)
        client.post(reverse("nodes:cleanup", args=[console.slug, node.name]))
        command = AgentCommand.objects.get(node=node, action="cleanup")
        wait_until(lambda: AgentCommand.objects.get(pk=command.pk).status == "ok", timeout=30,
                   what="the clean-up's ok")
        command.refresh_from_db()
        assert "parent" in command.message and "zombie" in command.message
        wait_until(lambda: not events(node, "zombie_processes", closed_at__isnull=True),
                   timeout=30, what="zombie_processes cleared")
        assert maker.poll() is None  # its parent was only signalled, not ended
        assert f"<strong>ok</strong>: {command.message}" in node_page(client, console, node)
    finally:
        maker.kill()
        maker.wait()

    # slurmd killed three times in a row: restarted each time, then flapping.
    for kill in range(1, 4):
        pid = cluster.slurmd_pid(NODE)
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: len(events(node, "slurmd_restarted")) == kill, timeout=30,
                   what=f"restart {kill} on the server")
        assert cluster.slurmd_pid(NODE) != pid
        cluster.wait_nodes_ready(nodes=[NODE])
    wait_until(lambda: events(node, "slurmd_flapping", closed_at__isnull=True), timeout=30,
               what="slurmd_flapping")
    wait_until(lambda: Repair.objects.filter(node=node, signature="slurmd_flapping").exists(),
               timeout=30, what="a recommendation for slurmd_flapping")
    repair = Repair.objects.get(node=node, signature="slurmd_flapping")
    assert (repair.action, repair.status) == ("reboot", Status.PROPOSED)
    page = node_page(client, console, node)
    assert "3 in the last 24 h" in page and "slurmd_flapping" in page
    cluster.run(["srun", "-w", NODE, "true"])  # the last slurmd the agent started runs jobs


def test_a_gres_conf_one_gpu_short_is_drift_that_the_reconfigure_repair_fixes(stack, cluster):
    gres_conf = cluster.etc / "gres.conf"
    dev = cluster.directory / "dev"
    gres_conf.write_text(f"AutoDetect=off\nNodeName={NODE} Name=gpu File={dev}/nvidia[0-6]\n")
    harness_slurmd = cluster.daemons[f"slurmd {NODE}"]
    harness_slurmd.stop()
    harness_slurmd.start()
    wait_for(lambda: "INVALID" in node_line(cluster), timeout=30,
             what=f"Slurm marks {NODE} invalid", alive=[harness_slurmd])

    console, node = start_console(stack)
    wait_until(lambda: events(node, "gres_drift", closed_at__isnull=True), timeout=30,
               what="gres_drift")
    (drift,) = events(node, "gres_drift")
    assert any("nvidia7" in problem for problem in drift.evidence["problems"])
    wait_until(lambda: Repair.objects.filter(node=node, status=Status.PROPOSED).exists(),
               timeout=30, what="the recommendation")
    repair = Repair.objects.get(node=node, status=Status.PROPOSED)
    assert (repair.action, repair.signature) == ("reconfigure", "gres_drift")

    do_approve_repair(repair, actor=UserFactory(username="omar", role=Role.OPERATOR))
    wait_until(lambda: Repair.objects.get(pk=repair.pk).status in (Status.SUCCEEDED,
                                                                   Status.FAILED),
               timeout=90, what="the reconfigure repair to end")
    repair.refresh_from_db()
    assert repair.status == Status.SUCCEEDED, repair.outcome
    line = node_line(cluster)
    state = re.search(r"\bState=(\S+)", line).group(1)
    assert "INVALID" not in state and "DRAIN" not in state, line
    assert re.search(r"\bGres=gpu:8\b", line), line
    assert f"File={dev}/nvidia[0-7]" in gres_conf.read_text()
    assert not HealthEvent.objects.filter(node=node, signature="gres_drift",
                                          closed_at__isnull=True).exists()
    cluster.run(["srun", "-w", NODE, "--gres=gpu:8", "true"])  # all eight schedulable again
