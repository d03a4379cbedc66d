"""The node page's hygiene panel (issue 17): slurmd, the process table and Slurm's GPUs from
the live entry, the slurmd restarts and job-end cleanups from their notices, and the
operator's clean-up (an audited agent command whose result shows)."""

import time
import uuid

import pytest
from django.urls import reverse

from clusters.models import AuditEntry
from healthchecks.models import HealthEvent
from gateway.ingest import ingest_events
from gateway.protocol import known_hygiene, live_sample
from nodes.live_store import get_live_store, reset_live_store
from nodes.models import AgentCommand
from nodes.services import do_record_command_result

from .factories import NodeFactory

pytestmark = pytest.mark.django_db

HYGIENE = {
    "slurmd": {"state": "running", "pid": 5151, "since": time.time() - 3 * 3600,
               "restarts": 2, "last_restart_at": time.time() - 600, "watched_by": "process",
               "restart": True},
    "processes": {"zombies": 12, "orphans": 3, "tasks": 3277, "pid_max": 32768,
                  "checked_at": time.time()},
    "gres": {"match": True, "nvml_gpus": 8, "slurm_gpus": 8, "checked_at": time.time()},
}
CLEANUP_REPORT = {
    "job_id": "4821", "user": "alice", "method": "proc", "found": 3,
    "processes": [{"pid": 991, "name": "python3", "cmdline": "python3 daemon.py"}],
    "ended": [991, 992], "killed": [993], "left": [], "ended_count": 2, "killed_count": 1,
    "left_count": 0, "gpu_processes": [], "gpu_check": "ok",
    "shm_removed": [{"path": "/dev/shm/nccl-1", "bytes": 41943040}],
    "shm_removed_bytes": 41943040, "shm_removed_files": 1, "shm_skipped": None,
    "duration_s": 2.1,
}


@pytest.fixture(autouse=True)
def store(settings):
    settings.REDIS_URL = ""
    reset_live_store()
    yield get_live_store()
    reset_live_store()


@pytest.fixture
def node(cluster):
    return NodeFactory(cluster=cluster, name="gpu-021", slurm_state="IDLE")


def report(node, store, hygiene=HYGIENE, received_at=None):
    frame = {"type": "sample", "seq": 1, "ts": time.time(), "gpus": [], "node": {}}
    store.record(node.cluster_id, live_sample(frame, node_id=node.pk,
                                             received_at=received_at or time.time(),
                                             memory_totals={}, hygiene=known_hygiene(hygiene)))


def event(signature, severity, message, detail, state="active"):
    return {"type": "event", "id": str(uuid.uuid4()), "ts": time.time(), "signature": signature,
            "severity": severity, "message": message, "detail": detail, "state": state}


def test_the_panel_shows_slurmd_processes_and_gres_from_the_live_entry(client_for, viewer,
                                                                       node, store):
    report(node, store)
    page = client_for(viewer).get(reverse("nodes:detail", args=[node.cluster.slug, node.name]))
    text = page.content.decode()
    assert 'id="node-hygiene"' in text
    assert "<strong>running</strong>" in text and "pid 5151" in text
    assert "2 since the agent started" in text
    assert "the agent restarts it when it dies" in text
    assert "<dt>Zombies</dt><dd>12" in text
    assert "3277 of 32768 (10.0 %)" in text
    assert "Slurm's GPUs match the hardware: 8 in NVML, 8 in Slurm." in text
    assert "Clean up processes" not in text  # a viewer does not act


def test_a_stale_entry_says_so_and_a_node_without_slurm_or_reports_has_no_panel(
        client_for, viewer, cluster, node, store):
    report(node, store, received_at=time.time() - 3600)
    text = client_for(viewer).get(reverse("nodes:hygiene", args=[cluster.slug, node.name])
                                  ).content.decode()
    assert "as the agent last reported" in text
    bare = NodeFactory(cluster=cluster, name="k8s-001", slurm_state="")
    text = client_for(viewer).get(reverse("nodes:detail", args=[cluster.slug, bare.name])
                                  ).content.decode()
    # Hidden until its agent reports: it polls, and appears when there is something to show.
    assert 'id="node-hygiene" hidden' in text and "Node hygiene" not in text


def test_restarts_and_job_cleanups_show_from_their_notices(client_for, viewer, node, store):
    report(node, store)
    ingest_events([
        (node.pk, event("slurmd_restarted", "info", "slurmd on gpu-021 was not running "
                        "(pid 4242, up 3 h 2 min): restarted, now pid 5151", {"pid": 5151})),
        (node.pk, event("slurmd_restarted", "info", "slurmd on gpu-021 was not running "
                        "(pid 5151, up 1 min): restarted, now pid 5152", {"pid": 5152})),
        (node.pk, event("job_cleanup", "info", "job 4821 (alice): 3 processes found",
                        CLEANUP_REPORT)),
    ])
    assert HealthEvent.objects.open().count() == 0  # notices are recorded closed
    text = client_for(viewer).get(reverse("nodes:detail", args=[node.cluster.slug, node.name])
                                  ).content.decode()
    assert "2 in the last 24 h" in text
    assert "now pid 5152" in text and "now pid 5151" in text
    row = text[text.index('id="job-cleanups"'):]
    assert '<td class="mono">4821</td><td>alice</td><td class="num">3</td><td>proc</td>' in row
    assert '<td class="num">2</td><td class="num">1</td><td class="num">0</td>' in row
    assert "1 file (40.0\xa0MB)" in row and "<td>clean</td>" in row


def test_open_hygiene_events_show_with_their_details(client_for, viewer, node, store):
    report(node, store, hygiene={**HYGIENE, "gres": {"match": False, "nvml_gpus": 8,
                                                     "slurm_gpus": 7, "checked_at": 1.0}})
    ingest_events([
        (node.pk, event("zombie_processes", "warning", "12 zombie processes (threshold 10)",
                        {"zombies": 12, "processes": [{"pid": 77, "name": "defunct-child",
                                                       "ppid": 76, "parent_name": "python3",
                                                       "parent_cmdline": "python3 leak.py",
                                                       "user": "alice"}]})),
        (node.pk, event("gres_drift", "warning", "Slurm's view of gpu-021's GPUs differs",
                        {"problems": ["Slurm's Gres says 7 GPUs, NVML sees 8"]})),
        (node.pk, event("job_leftovers", "warning", "job 4822 (bob) left 1 process holding "
                        "1002 MiB of GPU memory after cleanup", {"job_id": "4822"})),
    ])
    text = client_for(viewer).get(reverse("nodes:hygiene", args=[node.cluster.slug, node.name])
                                  ).content.decode()
    assert "python3 (76) python3 leak.py" in text
    assert "Slurm&#x27;s Gres says 7 GPUs, NVML sees 8" in text
    assert "The <em>reconfigure</em> repair" in text
    assert "left 1 process holding 1002 MiB" in text
    node.refresh_from_db()
    assert node.state == "unhealthy"


def test_an_operators_clean_up_is_an_audited_command_whose_result_shows(client_for, operator,
                                                                        node, store):
    report(node, store)
    client = client_for(operator)
    url = reverse("nodes:cleanup", args=[node.cluster.slug, node.name])
    response = client.post(url, HTTP_HX_REQUEST="true")
    command = AgentCommand.objects.get(node=node)
    assert command.action == "cleanup" and command.requested_by == operator
    text = response.content.decode()
    assert 'id="node-hygiene"' in text and 'hx-trigger="every 2s"' in text
    assert f"Clean-up #{command.pk} by alice" in text and "<strong>queued</strong>" in text
    (audit,) = AuditEntry.objects.filter(action="agentcommand.send")
    assert audit.changes["action"] == "cleanup"

    client.post(url)  # a second click while it runs: the same command
    assert AgentCommand.objects.filter(node=node).count() == 1

    do_record_command_result(node, command_id=command.pk, status="ok",
                             message="ended 3 orphaned processes (1 with SIGKILL); signalled "
                                     "2 parents of 5 zombies; 0 zombies left")
    text = client.get(reverse("nodes:hygiene", args=[node.cluster.slug, node.name])
                      ).content.decode()
    assert "<strong>ok</strong>: ended 3 orphaned processes" in text
    assert 'hx-trigger="every 15s"' in text


def test_the_counts_come_from_the_report_not_its_cut_lists(client_for, viewer, node, store):
    report(node, store)
    cut = {**CLEANUP_REPORT, "found": 12000, "ended": [1, 2], "ended_count": 11990,
           "killed_count": 10, "shm_removed": [{"path": "/dev/shm/a", "bytes": 1}],
           "shm_removed_files": 300, "cut": {"ended": 11990}}
    ingest_events([(node.pk, event("job_cleanup", "info", "job 4821 (alice): 12000 processes",
                                   cut))])
    text = client_for(viewer).get(reverse("nodes:hygiene", args=[node.cluster.slug, node.name])
                                  ).content.decode()
    row = text[text.index('id="job-cleanups"'):]
    assert '<td class="num">12000</td>' in row
    assert '<td class="num">11990</td><td class="num">10</td>' in row
    assert "300 files" in row


def test_gpus_in_mig_mode_are_not_compared_and_the_panel_says_why(client_for, viewer, node,
                                                                 store):
    report(node, store, hygiene={**HYGIENE, "gres": {
        "match": None, "nvml_gpus": 8, "slurm_gpus": None, "checked_at": 1.0,
        "not_compared": "MIG mode is on for GPU 0-7: Slurm counts MIG slices"}})
    text = client_for(viewer).get(reverse("nodes:hygiene", args=[node.cluster.slug, node.name])
                                  ).content.decode()
    assert "Not compared: MIG mode is on for GPU 0-7" in text
