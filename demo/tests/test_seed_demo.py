"""seed_demo: the demo cluster and accounts, embedded mode only."""

import io
import re
from datetime import timedelta

import pytest
from django.contrib.auth import authenticate, get_user_model
from django.core.management import CommandError, call_command
from django.utils import timezone

from demo import seed as demo
from clusters.models import AuditEntry, Cluster
from clusters.roles import Role, assign_role, role_of
from healthchecks.models import HealthEvent
from nodes.choices import NodeState
from nodes.models import ClusterRollup, Gpu, Node, NodeTransition
from nodes.states import boot_window, compute_state, facts_for, refresh_due_node_states
from notifications.choices import AlertKind

H200_MEMORY = 150754820096
EXPECTED_COUNTS = {
    NodeState.HEALTHY: 58,
    NodeState.BOOTING: 1,
    NodeState.UNHEALTHY: 3,
    NodeState.PENDING: 0,
    NodeState.PAUSED: 2,
}


# A day of usage takes the seed half a minute on the CI machine: the tests that do not look
# at it seed the last hour only, and test_it_writes_a_day_of_usage_that_follows_the_jobs the
# day that ships.
TESTS_HISTORY_MINUTES = 60


@pytest.fixture
def embedded(settings, db, monkeypatch):
    settings.EMBEDDED = True
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    monkeypatch.setattr(demo, "HISTORY_MINUTES", TESTS_HISTORY_MINUTES)
    return settings


def seed(*args):
    out = io.StringIO()
    call_command("seed_demo", *args, stdout=out)
    return out.getvalue()


def state_counts(cluster):
    counts = dict.fromkeys(NodeState, 0)
    for state in Node.objects.filter(cluster=cluster).values_list("state", flat=True):
        counts[state] += 1
    return counts


def snapshot():
    """Everything seed_demo writes, as comparable values."""
    User = get_user_model()
    return {
        "clusters": list(Cluster.objects.values_list("pk", "slug")),
        "nodes": list(Node.objects.order_by("pk").values_list(
            "pk", "name", "state", "state_reason", "state_changed_at", "boot_id", "last_seen",
            "paused_reason")),
        "gpus": list(Gpu.objects.order_by("pk").values_list("pk", "uuid")),
        "transitions": list(NodeTransition.objects.order_by("pk").values_list("pk", "at")),
        "events": list(HealthEvent.objects.order_by("pk").values_list(
            "pk", "count", "closed_at")),
        "rollups": list(ClusterRollup.objects.order_by("pk").values_list("pk", "minute")),
        "audit": AuditEntry.objects.count(),
        "users": list(User.objects.order_by("pk").values_list("pk", "username", "password")),
        "memberships": list(User.groups.through.objects.order_by("pk").values_list(
            "pk", "user__username", "group__name")),
    }


def test_it_seeds_the_demo_cluster(embedded):
    out = seed()
    now = timezone.now()

    cluster = Cluster.objects.get(slug="demo")
    assert cluster.name == "demo"
    assert cluster.region == "us-west-2"
    assert cluster.gpu_type == "NVIDIA H200"
    assert cluster.gpus_per_node == 8
    assert cluster.driver_version == "580.159.04"  # the fixture's real reading
    assert cluster.networking == "InfiniBand NDR 400 Gb/s, 8 x ConnectX-7 per node"
    assert cluster.os_image == "Ubuntu 22.04 LTS"
    assert str(cluster.billing_rate_per_gpu_hour) == "2.1000"
    assert cluster.acceptance_tests_enabled is False
    assert (cluster.repair_settings.provider, cluster.scheduler) == ("simulated", "slurm")

    nodes = list(Node.objects.filter(cluster=cluster).order_by("name"))
    assert [n.name for n in nodes] == [f"gpu-{i:03d}" for i in range(1, 65)]
    gpus = Gpu.objects.filter(node__cluster=cluster)
    assert gpus.count() == 64 * 8
    for node in nodes:
        assert sorted(node.gpus.values_list("index", flat=True)) == list(range(8))
    assert len(set(gpus.values_list("uuid", flat=True))) == 512
    for gpu in gpus:
        assert re.fullmatch(r"GPU-[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}", gpu.uuid)
        assert gpu.pci_bus_id == f"00000000:00:{6 + gpu.index:02X}.0"  # the fixture's H200 bus
        assert gpu.name == "NVIDIA H200"
        assert gpu.memory_total_bytes == H200_MEMORY

    assert state_counts(cluster) == EXPECTED_COUNTS
    assert "healthy 58, booting 1, unhealthy 3, pending 0, paused 2" in out

    # Every state is what the state function makes of the node's facts.
    for node in nodes:
        assert (node.state, node.state_reason) == compute_state(facts_for(node, now)), node.name
        # ... and the last transition on the timeline led to it.
        assert node.transitions.order_by("-at", "-id").first().to_state == node.state
        # The agents were heard from lately.
        assert now - node.last_seen < timedelta(minutes=2), node.name

    open_problems = sorted(
        HealthEvent.objects.open()
        .filter(node__cluster=cluster, severity__in=["warning", "critical"])
        .values_list("signature", flat=True)
    )
    assert open_problems == ["thermal_throttle", "xid:48", "xid:79"]
    paused = Node.objects.filter(cluster=cluster, state=NodeState.PAUSED)
    assert all(n.paused_reason.startswith(("paused by demo: ", "paused by admin: "))
               for n in paused)


def test_the_gpus_are_the_ones_the_simulated_agent_reports(embedded):
    simulated = pytest.importorskip("agent.sim.backend")
    seed()
    backend = simulated.SimulatedBackend("gpu-017")
    seeded = Gpu.objects.filter(node__cluster__slug="demo", node__name="gpu-017")
    assert sorted(seeded.values_list("index", "uuid", "pci_bus_id", "memory_total_bytes")) == [
        (g["index"], g["uuid"], g["pci_bus_id"], g["memory_total_bytes"]) for g in backend.gpus()
    ]


def test_it_writes_a_day_of_transitions(embedded):
    seed()
    now = timezone.now()
    transitions = NodeTransition.objects.filter(cluster__slug="demo")
    times = list(transitions.values_list("at", flat=True))
    assert len(times) > 64 * 3  # registered, first hello, boot window ended; then the day
    assert min(times) >= now - timedelta(hours=24, minutes=1)
    assert min(times) <= now - timedelta(hours=23, minutes=50)
    assert max(times) <= now
    assert len({int((now - t) / timedelta(hours=3)) for t in times}) >= 6  # across the day
    kinds = set(transitions.values_list("from_state", "to_state"))
    assert {("healthy", "unhealthy"), ("unhealthy", "healthy"), ("unhealthy", "booting"),
            ("booting", "healthy"), ("healthy", "paused"), ("paused", "healthy")} <= kinds
    by_people = transitions.filter(actor__username__in=["demo", "admin"])
    assert by_people.exists()

    closed_xids = HealthEvent.objects.filter(
        node__cluster__slug="demo", signature__startswith="xid:", closed_reason="node rebooted"
    )
    assert closed_xids.count() >= 3
    for event in closed_xids:
        assert event.evidence["source"] == "kmsg"
        assert re.match(r"NVRM: Xid \(PCI:0000:00:[0-9a-f]{2}\): \d+, ", event.evidence["kernel_line"])


def test_the_booting_node_turns_healthy_when_its_boot_window_ends(embedded):
    seed()
    later = timezone.now() + boot_window()
    assert refresh_due_node_states(now=later) == 1
    counts = state_counts(Cluster.objects.get(slug="demo"))
    assert counts[NodeState.BOOTING] == 0
    assert counts[NodeState.HEALTHY] == 59


def test_it_writes_a_day_of_usage_that_follows_the_jobs(embedded, monkeypatch):
    from agent.sim.workload import Workload

    monkeypatch.setattr(demo, "HISTORY_MINUTES", 24 * 60)
    seed()
    now = timezone.now()
    rollups = list(ClusterRollup.objects.filter(cluster__slug="demo").order_by("minute"))
    assert len(rollups) == 24 * 60
    minutes = [r.minute for r in rollups]
    assert all(m.second == 0 and m.microsecond == 0 for m in minutes)
    assert all(b - a == timedelta(minutes=1) for a, b in zip(minutes, minutes[1:]))
    # The day's complete minutes: the one under way is left to the live rollup writer
    # (up to 5 minutes old: seed() may take a while on a slow machine).
    assert timedelta(minutes=1) <= now - minutes[-1] < timedelta(minutes=5)
    for r in rollups:
        assert 440 <= r.gpus_reporting <= 512  # the day's nodes down and GPUs off the bus
        # Jobs hold between a fifth and nine tenths of the GPUs (a lull, a busy hour), with
        # their memory; the idle ones sit at 0 %.
        assert 10 <= r.gpu_util_pct <= 95 and 5 <= r.gpu_mem_used_pct <= 95
        assert 50e9 / 8 <= r.net_bps <= 600e9 / 8
    # Over the day, most of them: a busy cluster.
    assert 35 <= sum(r.gpu_util_pct for r in rollups) / len(rollups) <= 85

    # Each node's minutes, for its page's charts: its GPUs busy while a job holds them.
    node = Node.objects.get(cluster__slug="demo", name="gpu-012")
    node_minutes = list(node.rollups.order_by("minute"))
    assert len(node_minutes) >= 24 * 60 - 10
    workload = Workload(demo.node_names(), seed="demo")
    for rollup in node_minutes[::97]:
        busy = workload.running_on("gpu-012", rollup.minute.timestamp() + 30) is not None
        utils = [gpu["util_pct"][0] for gpu in rollup.gpus.values()]
        assert (min(utils) >= 50) if busy else (max(utils) == 0), (rollup.minute, utils)
        assert set(rollup.node_metrics) == {"net_rx_bps", "net_tx_bps", "cpu_pct"}


def test_it_creates_the_accounts(embedded):
    seed()
    demo_user = authenticate(username="demo", password="demo")
    admin_user = authenticate(username="admin", password="admin")
    assert role_of(demo_user) == Role.OPERATOR
    assert role_of(admin_user) == Role.ADMIN


def test_it_puts_existing_accounts_right(embedded):
    User = get_user_model()
    user = User.objects.create_user("demo", password="something-else", is_active=False)
    assign_role(user, Role.ADMIN)
    seed()
    user = authenticate(username="demo", password="demo")
    assert user is not None
    assert role_of(user) == Role.OPERATOR


def test_running_it_twice_changes_nothing(embedded):
    seed()
    before = snapshot()
    out = seed()
    assert "Kept the existing cluster demo" in out
    assert snapshot() == before


def test_reset_rebuilds_the_cluster(embedded):
    seed()
    first = Cluster.objects.get(slug="demo")
    out = seed("--reset")
    assert "created cluster demo" in out
    cluster = Cluster.objects.get(slug="demo")
    assert cluster.pk != first.pk
    assert Node.objects.count() == 64
    assert Gpu.objects.count() == 512
    assert state_counts(cluster) == EXPECTED_COUNTS
    assert ClusterRollup.objects.count() == TESTS_HISTORY_MINUTES


def test_reset_works_on_a_demo_that_has_been_used(embedded):
    """Used: a node with two open per-GPU events of one signature (issue 27: deleting the old
    cluster collided on one_open_event_per_node_signature)."""
    from healthchecks.services import do_record_health_event

    seed()
    node = Node.objects.filter(cluster__slug="demo", state=NodeState.HEALTHY).first()
    for gpu in node.gpus.all()[:2]:
        do_record_health_event(node, signature="xid:13", severity="warning", gpu=gpu,
                               message="Graphics Engine Exception")
    out = seed("--reset")
    assert "created cluster demo" in out
    assert Node.objects.count() == 64


def test_dry_run_leaves_nothing(embedded):
    out = seed("--dry-run")
    assert "rolled back" in out
    assert not Cluster.objects.exists()
    assert not get_user_model().objects.filter(username__in=["demo", "admin"]).exists()


def test_it_refuses_in_production_mode(settings, db):
    settings.EMBEDDED = False
    with pytest.raises(CommandError, match="embedded mode"):
        seed()
    assert not get_user_model().objects.filter(username__in=["demo", "admin"]).exists()
    assert not Cluster.objects.filter(slug="demo").exists()
    with pytest.raises(demo.NotEmbedded):
        demo.ensure_accounts()


def test_it_prepares_the_simulated_fleet(embedded, tmp_path):
    from agent.sim import simulated_boot_id
    from agent.connection.node_token import read_node_token
    from nodes.services import find_usable_token

    seed()
    demo.prepare_fleet(tmp_path)
    node = Node.objects.get(cluster__slug="demo", name="gpu-012")
    state_dir = str(tmp_path / "gpu-012")
    assert find_usable_token(read_node_token(state_dir)).node == node
    assert simulated_boot_id(state_dir) == node.boot_id  # connecting is not a reboot
    assert (tmp_path / "gpu-012" / "inject").read_text().strip() == demo.FLEET_FAULTS["gpu-012"]
    assert not (tmp_path / "gpu-001" / "inject").exists()
    assert node.state == "healthy"  # the faults land on healthy nodes


def test_the_simulated_slurm_gets_its_state_and_the_jobs_come_from_its_sacct(
        embedded, tmp_path, monkeypatch):
    import json
    import os
    import sys
    from pathlib import Path

    from jobs.models import Job

    state = tmp_path / "slurm.json"
    monkeypatch.setenv("DEMO_SLURM_STATE", str(state))
    monkeypatch.setenv("DEMO_SLURM_PYTHON", sys.executable)
    bin_dir = Path(demo.__file__).resolve().parent / "bin"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    out = seed("--fleet-dir", str(tmp_path), "--import-jobs")
    saved = json.loads(state.read_text())
    assert saved["nodes"] == demo.node_names() and saved["drains"] == saved["jobs"] == {}

    jobs = Job.objects.filter(cluster__slug="demo")
    assert re.search(rf"jobs from the simulated Slurm: {jobs.count()} new, 0 updated", out)
    assert jobs.count() > 1000 and jobs.filter(state="RUNNING", gpus=64).exists()
    assert {"alice", "bob", "chen", "dana", "erik", "fatima"} <= set(
        jobs.values_list("user", flat=True))

    # Kept as the operators left it, unless the demo is reset.
    saved["drains"] = {"gpu-001": [{"from": 1.0, "until": None, "reason": "kept"}]}
    state.write_text(json.dumps(saved))
    seed("--fleet-dir", str(tmp_path))
    assert json.loads(state.read_text())["drains"] != {}
    seed("--fleet-dir", str(tmp_path), "--reset")
    assert json.loads(state.read_text())["drains"] == {}


def test_the_demo_channel_posts_to_the_receiver_with_a_key_in_a_file(embedded, tmp_path):
    from clusters.secret_store import value_of
    from notifications.models import Channel

    seed()
    key_file = tmp_path / "receiver" / "signing.key"
    channel = demo.prepare_receiver("http://127.0.0.1:8025/clusterui", key_file)
    key = key_file.read_text().strip()
    assert key == value_of(channel.signing_secret) and key_file.stat().st_mode & 0o777 == 0o600
    assert value_of(channel.url_secret) == "http://127.0.0.1:8025/clusterui"
    assert channel.rules.count() == len(AlertKind.values)

    assert demo.prepare_receiver("http://127.0.0.1:8025/clusterui", key_file) == channel
    assert key_file.read_text().strip() == key  # kept

    key_file.unlink()  # lost: the channel gets a new key, the receiver the file
    demo.prepare_receiver("http://127.0.0.1:8025/clusterui", key_file)
    assert key_file.read_text().strip() == value_of(Channel.objects.get().signing_secret) != key
