"""Startup scripts end to end: daphne, the real agent of gpu-001 (simulated GPUs) and a real
Slurm cluster (tests/slurm.py) whose Prolog/Epilog run `python -m agent hook job-start` /
`job-end` through a small wrapper, as slurm.conf needs a path, not a command line.

The node_boot script holds gpu-001 in booting until it ends; `srun` on gpu-001 runs the job
scripts with Slurm's variables (their marker files hold the job id and user), and their
results are on the node page.
"""

import os
import sys

import pytest
from django.test import Client

from clusters.roles import Role
from clusters.tests.factories import ClusterFactory, UserFactory
from healthchecks.models import HealthEvent
from nodes.choices import NodeState
from nodes.models import Node
from startup.models import ScriptRun
from startup.services import do_save_startup_script, validate_body
from nodes.services import do_issue_join_token

from .browser import REPO_ROOT
from .integration import wait_until
from .test_live_integration import joined_node

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def save(cluster, event, body, timeout_s=60):
    return do_save_startup_script(cluster, event=event, role="worker", body=body,
                                  timeout_s=timeout_s, validation=validate_body(body))


def hook_wrapper(path, event, state_dir):
    """What an operator installs as slurm.conf's Prolog (job-start) or Epilog (job-end)."""
    path.write_text(f"#!/bin/sh\ncd {REPO_ROOT}\n"
                    f"exec {sys.executable} -m agent hook {event} --state-dir {state_dir}\n")
    path.chmod(0o755)
    return path


def test_boot_and_job_scripts_run_on_the_node_and_their_results_show(processes, slurm,
                                                                     tmp_path):
    processes.env.update(CLUSTERUI_BOOT_WINDOW_S="0")  # only the boot script holds it booting
    markers = tmp_path / "markers"
    markers.mkdir()
    markers.chmod(0o777)
    cluster = ClusterFactory(name="int-scripts", slug="int-scripts")
    boot = save(cluster, "node_boot", f'#!/bin/bash\nsleep 10\necho booted > "{markers}/boot"\n')
    save(cluster, "job_start", '#!/bin/bash\n'
         f'echo "$SLURM_JOB_ID $SLURM_JOB_USER" > "{markers}/start-$SLURM_JOB_ID"\n'
         'echo "prolog for job $SLURM_JOB_ID"\n')
    save(cluster, "job_end", f'#!/bin/bash\ntouch "{markers}/end-$SLURM_JOB_ID"\n')
    _, join_token = do_issue_join_token(cluster)
    server = processes.daphne()
    state_dir = tmp_path / "agent-state"
    agent = processes.agent("gpu-001", server, token=join_token, state_dir=state_dir)

    # Booting while the boot script runs (no result yet), up once its result arrived.
    node = joined_node(cluster, "gpu-001", agent=agent)
    node = Node.objects.get(pk=node.pk)
    assert node.state == NodeState.BOOTING and node.boot_tasks_running
    assert not ScriptRun.objects.filter(node=node).exists()
    assert not (markers / "boot").exists()
    wait_until(lambda: agent.check_running() or Node.objects.filter(
        pk=node.pk, state=NodeState.HEALTHY).exists(), timeout=30, what="gpu-001 healthy")
    assert (markers / "boot").read_text() == "booted\n"
    run = ScriptRun.objects.get(node=node, event="node_boot")
    assert (run.script_id, run.exit_code, run.job_id) == (boot.script_id, 0, "")

    # Slurm runs the hook as Prolog and Epilog.
    slurm.set_conf(Prolog=str(hook_wrapper(tmp_path / "prolog.sh", "job-start", state_dir)),
                   Epilog=str(hook_wrapper(tmp_path / "epilog.sh", "job-end", state_dir)))
    job_id = slurm.run(["srun", "-w", "gpu-001", "--job-name", "hooked", "bash", "-c",
                        "echo $SLURM_JOB_ID"]).stdout.strip()
    assert job_id.isdigit()
    assert (markers / f"start-{job_id}").read_text() == f"{job_id} root\n"
    wait_until(lambda: (markers / f"end-{job_id}").exists(), timeout=30,
               what="the job_end script ran from the Epilog")

    def job_runs():
        agent.check_running()
        runs = {r.event: r for r in ScriptRun.objects.filter(node=node, job_id=job_id)}
        return runs if len(runs) == 2 else None

    runs = wait_until(job_runs, timeout=30, what="both job scripts' results are stored")
    assert runs["job_start"].exit_code == 0 and runs["job_end"].exit_code == 0
    assert runs["job_start"].output_tail == f"prolog for job {job_id}\n"
    assert "DRAIN" not in slurm.run(["scontrol", "show", "node", "gpu-001", "-o"]).stdout

    wait_until(lambda: HealthEvent.objects.filter(node=node, signature="job_cleanup").exists(),
               timeout=30, what="the job's cleanup notice (the Epilog's node hygiene)")
    viewer = UserFactory(username="int-vera", role=Role.VIEWER)
    client = Client()
    client.force_login(viewer)
    page = client.get(node.get_absolute_url()).content.decode()
    assert "Startup script runs" in page and f"prolog for job {job_id}" in page
    # Once for each of its two scripts, and once in the job ends (its cleanup's notice).
    assert page.count(f'<td class="mono">{job_id}</td>') == 3


def test_a_failing_job_start_script_drains_the_node_in_slurm(processes, slurm, tmp_path):
    cluster = ClusterFactory(name="int-scripts-fail", slug="int-scripts-fail")
    save(cluster, "job_start", "#!/bin/bash\necho no scratch space >&2\nexit 3\n")
    _, join_token = do_issue_join_token(cluster)
    server = processes.daphne()
    state_dir = tmp_path / "agent-state"
    agent = processes.agent("gpu-002", server, token=join_token, state_dir=state_dir)
    node = joined_node(cluster, "gpu-002", agent=agent)
    wait_until(lambda: (state_dir / "startup_scripts.json").exists(), timeout=30,
               what="the agent saved its scripts")
    slurm.set_conf(Prolog=str(hook_wrapper(tmp_path / "prolog.sh", "job-start", state_dir)))

    slurm.sbatch("true", nodelist="gpu-002", name="hooked-fail")

    def drained():
        line = slurm.run(["scontrol", "show", "node", "gpu-002", "-o"]).stdout
        return "DRAIN" in line and "Prolog error" in line

    wait_until(drained, timeout=30, what="Slurm drains gpu-002 after the failing Prolog")
    run = wait_until(lambda: ScriptRun.objects.filter(node=node, event="job_start").first(),
                     timeout=30, what="the failing result is stored")
    assert run.exit_code == 3 and "no scratch space" in run.output_tail
    event = node.health_events.open().get(signature="startup_script_failed")
    assert "exited with 3" in event.message
