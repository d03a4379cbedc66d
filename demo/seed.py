"""The demo cluster for `make demo`: 64 nodes x 8 H200 GPUs with a day of history.

Everything is built through the services (do_register_node, do_record_hello, the health
event and pause/resume services, and the beat's refresh_due_node_states), replayed in time
order from 24 hours ago, so every state change is a real NodeTransition computed by the
state function. The GPU facts and the usage figures come from the real H200 readings in
agent/data/h200/ (see its README.md), the trace the simulated agents replay.
Deterministic: a seeded random.Random.

Embedded mode only: it creates accounts whose password is their name.
"""

import heapq
import itertools
import json
import random
import uuid
import zlib
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cache
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from clusters.forms import ClusterCreateForm
from common.bulk_sql import insert_rows
from clusters.models import Cluster
from clusters.roles import Role, assign_role
from clusters.services import do_create_cluster
from healthchecks.choices import Severity
from healthchecks.models import HealthEvent
from healthchecks.services import do_close_health_event, do_record_health_event
from nodes.choices import DISPLAY_ORDER
from nodes.models import ClusterRollup, Node, NodeRollup, NodeTransition
from nodes.rollups import GPU_METRICS, NODE_METRICS
from nodes.services import (
    do_issue_node_token,
    do_pause_node,
    do_record_hello,
    do_register_node,
    do_resume_node,
)
from nodes.states import boot_window, refresh_due_node_states
from notifications.choices import AlertKind
from notifications.models import Channel
from notifications.services import do_create_channel, do_rotate_signing_key
from repairs.models import RepairSettings

from agent.connection.node_token import save_node_token
from agent.sim import INJECT_FILE, SIMULATED_BOOT_ID_FILE, SimulatedBackend
from agent.sim.backend import load_fixture
from agent.sim.fleet import SimulatedNodeMetrics
from agent.sim.workload import Workload, new_state

CLUSTER_SLUG = "demo"
NODE_COUNT = 64
GPUS_PER_NODE = 8
# Faults the live demo fleet injects a while after `make demo` starts, on nodes that are
# healthy at the end of the seeded day (the day's script leaves them out).
FLEET_FAULTS = {
    # GPU 3 falls off the bus: the kernel's Xid 79, and NVML no longer sees it (gpu_lost).
    "gpu-012": "xid:79@90s:gpu3,gpu_lost@90s:gpu3",
    "gpu-040": "thermal@45s+60s:gpu5",
    # Node hygiene (agent/sim/hygiene.py): a reconfigure to approve, zombies to clean
    # up, a slurmd that keeps dying, and a job that leaves GPU memory held.
    "gpu-020": "gres_drift@60s",
    "gpu-033": "zombies@75s",
    "gpu-051": "slurmd_flap@30s",
    "gpu-058": "job_leftovers@120s:gpu2",
}
AGENT_VERSION = "1.0.0"
RANDOM_SEED = 20250817
HISTORY = timedelta(hours=24)
HISTORY_MINUTES = int(HISTORY.total_seconds() // 60)
HISTORY_SAMPLE_SECOND = 30  # of each seeded minute, the one its reading is taken at
HISTORY_INSERT_ROWS = 2000
ALL_GPUS = frozenset(range(GPUS_PER_NODE))

# username, role: the password is the username (embedded mode only).
ACCOUNTS = (("demo", Role.OPERATOR), ("admin", Role.ADMIN))

# Xid codes used by the script, with NVIDIA's catalog meaning (shared/data/xid_catalog.tsv,
# "description"), the severity DESIGN.md's bucket table gives them, and the NVRM line's tail.
XIDS = {
    79: ("GPU has fallen off the bus", Severity.CRITICAL,  # RESTART_BM
         "GPU has fallen off the bus."),
    48: ("Double Bit ECC Error", Severity.CRITICAL,  # WORKFLOW_XID_48
         "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
         "at partition {p}, subpartition {s}."),
    119: ("GSP RPC Timeout", Severity.CRITICAL,  # RESET_GPU
          "Timeout after 6s of waiting for RPC response from GPU{gpu} GSP! Expected function 76 "
          "(GSP_RM_CONTROL) (0x20801348 0x4)."),
    # RESTART_APP: the application's problem, info, the node stays healthy.
    94: ("Contained memory error", Severity.INFO,
         "Contained: SM (0x1). RST: No, D-RST: No"),
    13: ("Graphics Engine Exception", Severity.INFO,
         "Graphics SM Warp Exception on (GPC {p}, TPC {s}, SM 0): Out Of Range Address"),
}

MAINTENANCE = (
    "replacing ConnectX-7 NIC mlx5_3 (ticket DC-4821)",
    "BMC and NVSwitch firmware update",
    "kernel update 5.15.0-131 and reboot",
)


class SeedError(Exception):
    """The demo cannot be seeded here."""


class NotEmbedded(SeedError):
    """Seeding refused: accounts with known passwords never exist in production mode."""


@cache
def snapshot():
    return load_fixture("nvml_snapshot.json")


@cache
def trace():
    return load_fixture("nvml_trace.json")


def gpu_facts():
    """What the fixture's real H200 reports: model, memory, driver."""
    snap = snapshot()
    device = snap["devices"][0]
    return {
        "name": device["name"],
        "memory_total_bytes": device["dynamic"]["memory"]["total"],
        "driver_version": snap["driver_version"],
        "slowdown_c": device["temp_slowdown_threshold_c"],
    }


def node_names():
    return [f"gpu-{i:03d}" for i in range(1, NODE_COUNT + 1)]


def pci_device(index):
    return int(snapshot()["devices"][0]["pci"]["device"]) + index


def kmsg_pci(index):
    # The kernel log's domain:bus:device form: "NVRM: Xid (PCI:0000:00:06): ..."
    return f"0000:00:{pci_device(index):02x}"


def hello_gpus(node_name):
    """The GPUs the demo fleet's simulated agent reports, so its hello matches the seed."""
    return SimulatedBackend(node_name, gpu_count=GPUS_PER_NODE).gpus()


# --- accounts ------------------------------------------------------------------------------

def ensure_accounts():
    """demo (operator) and admin (admin), password = name. Returns {username: user}."""
    if not settings.EMBEDDED:
        raise NotEmbedded("demo accounts exist only in embedded mode")
    User = get_user_model()
    users = {}
    role_groups = {r.group_name for r in Role}
    for username, role in ACCOUNTS:
        user, created = User.objects.get_or_create(username=username)
        if created or not user.is_active or not user.check_password(username):
            user.set_password(username)
            user.is_active = True
            user.save()
        held = set(user.groups.filter(name__in=role_groups).values_list("name", flat=True))
        if held != {role.group_name}:
            assign_role(user, role)
        users[username] = user
    return users


# --- the day's script ----------------------------------------------------------------------

@dataclass(order=True)
class Step:
    at: object
    seq: int
    action: object = field(compare=False)


class Script:
    """A time-ordered list of service calls, replayed with each call's own `now`."""

    def __init__(self, cluster, users, now, rng):
        self.cluster, self.users, self.now, self.rng = cluster, users, now, rng
        self.start = now - HISTORY
        self.heap = []
        self.seq = itertools.count()
        self.nodes = {}
        self.boots = {}  # node name -> boots so far
        self.events = {}  # (node name, key) -> open HealthEvent
        # For the usage history: (node name, GPU indexes offline, from, until) and pause
        # intervals.
        self.offline = []
        self.paused = []

    def at(self, t, action):
        heapq.heappush(self.heap, Step(t, next(self.seq), action))

    def run(self):
        while self.heap:
            step = heapq.heappop(self.heap)
            if step.at > self.now:
                continue  # after "now": the real beat does it (a boot window ending)
            step.action(step.at)

    # Actions, each scheduled at a time t.

    def boot_id(self, name):
        n = self.boots.get(name, 0)
        self.boots[name] = n + 1
        return str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{name}.demo/boot/{n}"))

    def register(self, name, t):
        def act(t):
            self.nodes[name] = do_register_node(self.cluster, name, now=t)
        self.at(t, act)

    def hello(self, name, t, *, reboot):
        def act(t):
            node = self.nodes[name]
            boot_id = self.boot_id(name) if reboot else node.boot_id
            self.nodes[name] = do_record_hello(
                node, boot_id=boot_id, agent_version=AGENT_VERSION, gpus=hello_gpus(name), now=t
            )
        self.at(t, act)
        if reboot:
            self.beat_after(t)

    def beat_after(self, t):
        """The beat task runs every 10 s: the first run after the boot window ends."""
        self.at(t + boot_window() + timedelta(seconds=self.rng.uniform(0.5, 10)),
                lambda t: refresh_due_node_states(now=t))

    def reboot(self, name, t, *, down_s=None):
        """The node goes down and comes back: a hello with a new boot_id at t."""
        down_s = down_s if down_s is not None else self.rng.randint(150, 300)
        self.offline.append((name, ALL_GPUS, t - timedelta(seconds=down_s), t))
        self.hello(name, t, reboot=True)

    def xid(self, name, code, gpu, t, *, back=None):
        """Xid `code` on GPU `gpu` at t; an Xid 79 takes the GPU away until `back` (a reboot)."""
        meaning, severity, tail = XIDS[code]
        pid = "'<unknown>', name=<unknown>" if code == 79 else (
            f"{self.rng.randint(2000, 98000)}, name=pt_main_thread")
        line = (f"NVRM: Xid (PCI:{kmsg_pci(gpu)}): {code}, pid={pid}, "
                + tail.format(gpu=gpu, p=self.rng.randint(0, 7), s=self.rng.randint(0, 1)))

        def act(t):
            self.events[(name, f"xid:{code}")] = do_record_health_event(
                self.nodes[name], signature=f"xid:{code}", severity=severity,
                message=f"Xid {code}: {meaning}", gpu=self.nodes[name].gpus.get(index=gpu),
                evidence={"xid": code, "source": "kmsg", "kernel_line": line}, now=t,
            )
        self.at(t, act)
        if code == 79:
            self.offline.append((name, frozenset([gpu]), t, back or self.now))

    def thermal(self, name, gpu, t):
        slowdown = gpu_facts()["slowdown_c"]
        temp = self.rng.randint(slowdown - 3, slowdown)

        def act(t):
            self.events[(name, "thermal_throttle")] = do_record_health_event(
                self.nodes[name], signature="thermal_throttle", severity=Severity.WARNING,
                message=f"GPU {gpu}: SW thermal slowdown held for 60 s at {temp} °C",
                gpu=self.nodes[name].gpus.get(index=gpu),
                evidence={"clock_event_reasons": "0x0000000000000020",
                          "reasons": ["SW_THERMAL_SLOWDOWN"], "temperature_c": temp,
                          "slowdown_threshold_c": slowdown, "held_s": 60},
                now=t,
            )
        self.at(t, act)

    def close(self, name, key, t, reason):
        def act(t):
            do_close_health_event(self.events.pop((name, key)), reason=reason, now=t)
        self.at(t, act)

    def pause(self, name, username, t, reason):
        self.at(t, lambda t: do_pause_node(
            self.nodes[name], actor=self.users[username], reason=reason, now=t))

    def resume(self, name, username, t):
        self.at(t, lambda t: do_resume_node(self.nodes[name], actor=self.users[username], now=t))
        self.beat_after(t)


def write_script(script):
    """The day, as DESIGN.md's overview shows it at the end: 58 healthy, 1 booting,
    3 unhealthy (open xid:79, xid:48, thermal_throttle), 0 pending, 2 paused."""
    rng, start, now = script.rng, script.start, script.now
    minutes = lambda m: timedelta(minutes=m)  # noqa: E731
    seconds = lambda s: timedelta(seconds=s)  # noqa: E731
    names = node_names()

    # The fleet joins: registered, then each agent's first hello (booting for the window).
    for i, name in enumerate(names):
        script.register(name, start + seconds(2 * i))
        script.hello(name, start + seconds(90 + 2 * i + rng.uniform(0, 1.5)), reboot=True)

    cast = rng.sample([n for n in names if n not in FLEET_FAULTS], 6 + 14)
    ending, history = cast[:6], iter(cast[6:])
    gpu = lambda: rng.randrange(8)  # noqa: E731
    day = lambda: start + minutes(rng.uniform(40, 24 * 60 - 90))  # noqa: E731

    # Faults earlier in the day, each ended by a reboot and the event closed.
    for code in (79, 119, 48):
        name, t = next(history), day()
        back = t + minutes(rng.uniform(9, 25))
        script.xid(name, code, gpu(), t, back=back)
        script.reboot(name, back)
        script.close(name, f"xid:{code}", back + seconds(rng.uniform(3, 8)), "node rebooted")
    # One handled by hand: the operator pauses it, reboots it, and resumes it.
    name, t = next(history), day()
    script.xid(name, 48, gpu(), t)
    script.pause(name, "demo", t + minutes(rng.uniform(4, 9)), "draining for a reboot (xid:48)")
    back = t + minutes(rng.uniform(14, 20))
    script.reboot(name, back)
    script.close(name, "xid:48", back + seconds(5), "node rebooted")
    script.resume(name, "demo", back + seconds(rng.uniform(40, 90)))
    # Application faults: info, the node stays healthy; closed after an hour without a repeat.
    for code in (94, 13, 13):
        name, t = next(history), day()
        script.xid(name, code, gpu(), t)
        script.close(name, f"xid:{code}", t + minutes(60), "no repeat for an hour")
    # Thermal throttling that clears after some minutes.
    for _ in range(5):
        name, t = next(history), day()
        script.thermal(name, gpu(), t)
        script.close(name, "thermal_throttle", t + minutes(rng.uniform(3, 16)), "cleared")
    # Planned maintenance: paused, rebooted with a new kernel, resumed.
    name, t = next(history), day()
    script.pause(name, "admin", t, MAINTENANCE[2])
    script.reboot(name, t + minutes(rng.uniform(6, 12)))
    script.resume(name, "admin", t + minutes(rng.uniform(25, 35)))
    script.paused.append((name, t, t + minutes(35)))
    # A recent application fault still open: info, shown, but the node is healthy.
    name = next(history)
    script.xid(name, 13, gpu(), now - minutes(rng.uniform(20, 35)))

    # The end state.
    xid79, xid48, hot, rebooting, nic, firmware = ending
    script.xid(xid79, 79, 3, now - minutes(58))
    script.xid(xid48, 48, gpu(), now - minutes(rng.uniform(120, 160)))
    script.thermal(hot, gpu(), now - minutes(rng.uniform(6, 12)))
    t = now - minutes(rng.uniform(24, 30))
    script.xid(rebooting, 119, gpu(), t)
    script.reboot(rebooting, now - seconds(min(60, boot_window().total_seconds() / 2)),
                  down_s=90)
    script.close(rebooting, "xid:119", now - seconds(min(55, boot_window().total_seconds() / 3)),
                 "node rebooted")
    t = now - minutes(rng.uniform(180, 200))
    script.pause(nic, "admin", t, MAINTENANCE[0])
    script.paused.append((nic, t, now))
    t = now - minutes(rng.uniform(35, 45))
    script.pause(firmware, "demo", t, MAINTENANCE[1])
    script.paused.append((firmware, t, now))

    # The agents' latest hello (same boot): last_seen is now, not the day's first connect.
    for name in names:
        if name != rebooting:
            script.hello(name, now - seconds(rng.uniform(2, 25)), reboot=False)


# --- usage history ---------------------------------------------------------------------------

def usage_history(cluster, script):
    """A day of per-minute usage (NodeRollup and ClusterRollup rows), from the simulation the
    live fleet runs: each node's GPUs follow the simulated Slurm's job of that minute
    (agent/sim/workload.py, through SimulatedBackend and the fleet's node metrics), so the
    seeded history joins the live data without a step. A node down or a GPU off the bus (the
    day's script) leaves its gap."""
    names = node_names()
    workload = Workload(names, seed=CLUSTER_SLUG)
    node_ids = dict(Node.objects.filter(cluster=cluster).values_list("name", "pk"))
    # The complete minutes of the day before now; the minute under way is the live writers'.
    last = script.now.replace(second=0, microsecond=0) - timedelta(minutes=1)
    minutes = [last - timedelta(minutes=m) for m in range(HISTORY_MINUTES - 1, -1, -1)]
    now_s = script.now.timestamp()
    clock = [0.0]
    # util, GPUs, memory used, memory total, network, SM activity
    totals = {minute: [0.0, 0, 0.0, 0, 0.0, 0.0] for minute in minutes}
    rows = []
    for name in names:
        jobs = [job for job in workload.jobs_on(name, minutes[0].timestamp(), now_s, now_s)
                if job.start is not None]
        running = [None]
        backend = SimulatedBackend(name, gpu_count=GPUS_PER_NODE, clock=lambda: clock[0],
                                   job=lambda: running[0])
        host = SimulatedNodeMetrics(backend, phase=zlib.crc32(name.encode()) % 360)
        memory = backend.gpus()[0]["memory_total_bytes"]
        down = [(indexes, t0, t1) for node, indexes, t0, t1 in script.offline if node == name]
        for minute in minutes:
            offline = set()
            for indexes, t0, t1 in down:
                if t0 <= minute + timedelta(seconds=59) and minute <= t1:
                    offline |= indexes
            if len(offline) == GPUS_PER_NODE:
                continue  # down: no sample that minute
            # One reading a minute, the minute's mean and peak alike.
            clock[0] = t = minute.timestamp() + HISTORY_SAMPLE_SECOND
            running[0] = next((job for job in jobs if job.start <= t
                               and (job.end is None or t < job.end)), None)
            readings = [gpu for i, gpu in enumerate(backend.read_gpus()) if i not in offline]
            gpus = {gpu["uuid"]: {m: [gpu[m], gpu[m]] for m in GPU_METRICS} for gpu in readings}
            host_readings = host.following(readings, t)
            node_metrics = {m: [host_readings[m], host_readings[m]] for m in NODE_METRICS}
            rows.append((node_ids[name], minute, gpus, node_metrics))
            total = totals[minute]
            total[0] += sum(gpu["util_pct"] for gpu in readings)
            total[1] += len(readings)
            total[2] += sum(gpu["mem_used_bytes"] for gpu in readings)
            total[3] += len(readings) * memory
            total[4] += host_readings["net_rx_bps"] + host_readings["net_tx_bps"]
            total[5] += sum(gpu["sm_active_pct"] for gpu in readings)
    for start in range(0, len(rows), HISTORY_INSERT_ROWS):
        insert_rows(NodeRollup, ("node", "minute", "gpus", "node_metrics"),
                    rows[start:start + HISTORY_INSERT_ROWS])
    ClusterRollup.objects.bulk_create(
        ClusterRollup(cluster=cluster, minute=minute, gpus_reporting=count,
                      gpu_util_pct=util / count, gpu_mem_used_pct=100 * used / memory,
                      net_bps=net, gpu_sm_active_pct=sm_active / count)
        for minute, (util, count, used, memory, net, sm_active) in totals.items() if count)

# --- the whole seed --------------------------------------------------------------------------

@dataclass
class Result:
    cluster: Cluster
    created: bool
    users: dict
    counts: dict = field(default_factory=dict)
    transitions: int = 0
    events: int = 0
    open_events: int = 0
    rollups: int = 0


def create_cluster():
    """The cluster, through the clusters app's form and service (the console's creation page
    adds its other sections around them: overview/creation.py)."""
    facts = gpu_facts()
    data = {name: Cluster._meta.get_field(name).get_default()
            for name in ClusterCreateForm._meta.fields}
    data.update({
        "slug": CLUSTER_SLUG,
        "name": CLUSTER_SLUG,
        "region": "us-west-2",
        "gpu_type": facts["name"],
        "gpus_per_node": 8,
        "driver_version": facts["driver_version"],
        "networking": "InfiniBand NDR 400 Gb/s, 8 x ConnectX-7 per node",
        "os_image": "Ubuntu 22.04 LTS",
        "billing_rate_per_gpu_hour": "2.10",
        "acceptance_tests_enabled": False,
        "degraded_threshold_pct": 10,
        # The demo's own sacct, squeue, scontrol and scancel (demo/slurm) answer for the
        # simulated fleet, through the same Slurm adapter as a real cluster's.
        "scheduler": Cluster.Scheduler.SLURM,
        "scheduler_config": "",
    })
    form = ClusterCreateForm(data)
    if not form.is_valid():
        raise SeedError(f"cannot create cluster {CLUSTER_SLUG}: {form.errors.as_text()}")
    return do_create_cluster(form, actor=None)


def summarize(result):
    cluster = result.cluster
    by_state = dict.fromkeys(DISPLAY_ORDER, 0)
    for state in Node.objects.filter(cluster=cluster).values_list("state", flat=True):
        by_state[state] += 1
    result.counts = by_state
    result.transitions = NodeTransition.objects.filter(cluster=cluster).count()
    events = HealthEvent.objects.filter(node__cluster=cluster)
    result.events = events.count()
    result.open_events = events.open().count()
    result.rollups = ClusterRollup.objects.filter(cluster=cluster).count()
    return result


@transaction.atomic
def seed(*, reset=False, now=None):
    """Create the accounts and, unless it exists (or `reset`), the demo cluster."""
    if not settings.EMBEDDED:
        raise NotEmbedded("seed_demo runs only in embedded mode (CLUSTERUI_MODE=embedded)")
    now = now or timezone.now()
    users = ensure_accounts()
    existing = Cluster.objects.filter(slug=CLUSTER_SLUG).first()
    if existing is not None and not reset:
        return summarize(Result(existing, False, users))
    if existing is not None:
        existing.delete()
    cluster = create_cluster()
    # The demo fleet's machines are simulated: "reprovision" and "failover" reboot the
    # simulated agent.
    RepairSettings.objects.create(cluster=cluster, provider=RepairSettings.Provider.SIMULATED)
    rng = random.Random(RANDOM_SEED)
    script = Script(cluster, users, now, rng)
    write_script(script)
    script.run()
    usage_history(cluster, script)
    return summarize(Result(cluster, True, users))


SLURM_STATE_FILE = "slurm.json"


def prepare_fleet(fleet_dir, *, reset=False):
    """Give each demo node's simulated agent its state dir: a fresh node token, the node's
    seeded boot id (connecting is then not a reboot) and its scheduled faults; and the
    simulated Slurm its state file (fleet_dir/slurm.json: the nodes, no drain), kept unless
    it is missing or `reset`."""
    cluster = Cluster.objects.get(slug=CLUSTER_SLUG)
    slurm_state = Path(fleet_dir) / SLURM_STATE_FILE
    if reset or not slurm_state.exists():
        slurm_state.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        slurm_state.write_text(json.dumps(new_state(node_names(), seed=CLUSTER_SLUG), indent=1))
    for node in Node.objects.filter(cluster=cluster):
        state_dir = Path(fleet_dir) / node.name
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        save_node_token(str(state_dir), do_issue_node_token(node)[1])
        (state_dir / SIMULATED_BOOT_ID_FILE).write_text(node.boot_id + "\n")
        inject = state_dir / INJECT_FILE
        if node.name in FLEET_FAULTS:
            inject.write_text(FLEET_FAULTS[node.name] + "\n")
        else:
            inject.unlink(missing_ok=True)
    return cluster.nodes.count()


# The demo's notification channel: a signed webhook to scripts/demo_receiver.py on loopback,
# so a newcomer sees a message arrive (var/notifications.log).
DEMO_CHANNEL = "demo receiver"


def prepare_receiver(url, key_file):
    """The demo cluster's channel to the demo receiver at `url`, hearing of every kind; its
    signing key in `key_file` (mode 600) for the receiver to verify with. A key file that
    is gone gets a new key (the channel's is shown only once)."""
    cluster = Cluster.objects.get(slug=CLUSTER_SLUG)
    admin = get_user_model().objects.get(username="admin")
    key_file = Path(key_file)
    channel = Channel.objects.filter(cluster=cluster, name=DEMO_CHANNEL).first()
    if channel is None:
        channel, key = do_create_channel(
            cluster, name=DEMO_CHANNEL, kind=Channel.Kind.WEBHOOK, url=url, actor=admin,
            group_wait_s=10, rules=[{"kind": kind} for kind in AlertKind.values])
    elif not key_file.exists():
        key = do_rotate_signing_key(channel, actor=admin)
    else:
        return channel
    key_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key_file.touch(mode=0o600)
    key_file.write_text(key + "\n")
    return channel

