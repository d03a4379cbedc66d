"""The storm benchmark: does the control loop keep working through an event storm?

    bench/storm/run.sh [--nodes 2000] [--rates 100,200,500,1000,1500,2000] [--step-s 20]
    bench/storm/embedded.sh --nodes 1000 --rates 100,200,300

Production mode (bench/storm/run.sh: a throwaway PostgreSQL and Redis), or embedded mode
(bench/storm/embedded.sh: SQLite files in the run's folder, as `make demo`), one daphne
process on core 0, and on core 1 the Celery workers as README.md runs them (one for the
sweeps queue, one for the rest; one process each), the beat, PostgreSQL, Redis and this
driver. The driver holds every node's agent connection
itself (bench/ingest/loadgen.py's simulated agent: hello, then samples at 1 Hz) and:

1. steps the event rate up (--rates, events/s over the whole fleet, round-robin over the
   nodes): a mix of new signatures (throttling of a GPU that was not throttled), repeats
   of an open one and `cleared` of an open one (--new, --clear); per step it prints the
   events acked/offered, ack latency p50/p99 (send to ack, so including the database
   commit), the deepest Celery queue seen, and the server's CPU;
2. then, with events stopped and every event sent acked (the server's backlog gone), 200
   nodes go silent (--silent: they stop sending, their
   sockets stay open, a hung node) and one other node sends Xid 79: it prints the
   heartbeat_lost detection delay (last frame sent to the event's first_seen; the rule is
   CLUSTERUI_HEARTBEAT_INTERVALS sample intervals of silence), the time from the Xid to
   its recommended repair, and from approving that repair to the reboot command reaching
   the node's socket.

Targets (issue 14): 1,000 events/s with ack p99 < 1 s, heartbeat loss p95 <= 10 s, the
recommendation within 10 s, queue depth bounded.
"""

import argparse
import asyncio
import datetime
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import psutil
import redis

REPO = Path(__file__).resolve().parents[2]
INGEST = REPO / "bench" / "ingest"
PY = sys.executable
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "clusterui.settings")


# The ingest bench's server start-up, percentiles and simulated agent, imported not copied.
from bench.ingest import loadgen  # noqa: E402
from bench.ingest import run as ingest  # noqa: E402

from agent.connection import protocol  # noqa: E402
from agent.connection.client import WELCOME_TIMEOUT_S, backoff_delay  # noqa: E402

log = ingest.log
percentile = ingest.percentile
SLUG = "bench"  # bench/ingest/fleet.py's cluster
SIGNATURES = ("thermal_throttle", "hw_slowdown", "power_brake")
QUEUES = ("celery", "sweeps", "recommend", "provider", "notify")
WORKERS = ("server", "publisher", "worker", "sweeps", "recommend")
PACE_EVERY_S = 0.005
CONNECT_TIMEOUT_S = 10.0  # websockets' default open timeout, as the agent connects
ACK_GRACE_S = 3.0  # after a step: acks still in flight count for it
METRICS_TOKEN = "bench-storm-metrics"
ACK_HISTOGRAM = "clusterui_gateway_event_ack_seconds"


def next_storm_key(open_keys, gpu_count, rng, new_share, clear_share):
    """The storm's next event of a node: ((GPU index, signature), "active" or "cleared").
    `open_keys`, the node's open (index, signature) keys, is kept up to date here."""
    free = [(i, s) for i in range(gpu_count) for s in SIGNATURES if (i, s) not in open_keys]
    draw = rng.random()
    if open_keys and draw < clear_share:
        return open_keys.pop(rng.randrange(len(open_keys))), "cleared"
    if free and (not open_keys or draw < clear_share + new_share):
        key = rng.choice(free)
        open_keys.append(key)
        return key, "active"
    return rng.choice(open_keys), "active"


class StormAgent(loadgen.Agent):
    """A simulated agent that also sends events and notes what the server answers."""

    def __init__(self, *args, tracker, **kwargs):
        super().__init__(*args, **kwargs)
        self.tracker = tracker
        self.open = []  # (gpu index, signature) of events it opened and did not clear
        self.silent_since = None
        self.last_sent = 0.0
        self.commands = []  # (received, frame)
        self.welcomed = False
        self.closed_with = None  # the close code, once the connection has closed

    async def start(self, compression, open_timeout=300, welcome_timeout=None):
        await super().start(compression, open_timeout, welcome_timeout)
        self.welcomed = True

    async def read(self):
        try:
            async for message in self.ws:
                now = time.time()
                frame = json.loads(message)
                kind = frame.get("type")
                if kind == "ack":
                    for event_id in frame["ids"]:
                        self.tracker.acked.setdefault(event_id, now)
                elif kind == "error":
                    self.tracker.errors[frame.get("code")] += 1
                elif kind == "command":
                    self.commands.append((now, frame))
                    if frame.get("action") == "collect_bundle":
                        # As an agent that cannot collect one: the repair goes on without it.
                        self.send_now(json.dumps(protocol.command_result_frame(
                            command_id=frame["id"], status="failed",
                            message="the bench's agent collects no diagnostic bundle")))
        except loadgen.ConnectionClosed as exc:
            self.closed_with = exc.rcvd.code if exc.rcvd else "no close frame"
        else:  # closed normally
            self.closed_with = self.ws.close_code

    def sample(self, now_mono):
        if self.send_now(self.frame(now_mono)):
            self.last_sent = time.time()
            return True
        return False

    def storm_event(self, rng, new_share, clear_share):
        gpus = self.backend.gpus()
        (index, signature), state = next_storm_key(self.open, len(gpus), rng, new_share,
                                                   clear_share)
        return protocol.event_frame(signature=signature, severity="warning",
                                    message=f"bench/storm: {signature}",
                                    gpu_uuid=gpus[index]["uuid"],
                                    detail={"source": "bench"}, state=state)

    def send_event(self, frame):
        frame["ts"] = time.time()
        if not self.send_now(protocol.encode(frame)):
            return False
        self.tracker.sent[frame["id"]] = frame["ts"]
        self.last_sent = frame["ts"]
        return True


async def connect_as_the_agent(agent, rng):
    """Connect and say hello until welcomed, as agent.connection.client does: a connect gives
    up after 10 s, a welcome after WELCOME_TIMEOUT_S, and each try waits the agent's backoff
    after the last. The handshakes that failed."""
    failed, attempt = 0, 0
    while True:
        try:
            await agent.start(None, open_timeout=CONNECT_TIMEOUT_S,
                              welcome_timeout=WELCOME_TIMEOUT_S)
            return failed
        except Exception:  # noqa: BLE001 - refused, timed out, closed: as the agent, again
            failed += 1
            if agent.ws is not None:
                await agent.ws.close()
        await asyncio.sleep(backoff_delay(attempt, rng))
        attempt += 1


class PagePoller:
    """GET a page every `every_s` from a thread: (when sent, seconds, status) of each, by
    phase."""

    def __init__(self, url, every_s=0.2):
        self.url, self.every_s = url, every_s
        self.phase, self.answers = "idle", {}
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.poll, daemon=True)

    def poll(self):
        while not self.stopped.is_set():
            started = time.monotonic()
            try:
                with urllib.request.urlopen(self.url, timeout=30) as response:
                    status = response.status
            except urllib.error.HTTPError as exc:
                status = exc.code
            except OSError:
                status = None  # refused (the server is down) or timed out
            self.answers.setdefault(self.phase, []).append(
                (started, time.monotonic() - started, status))
            self.stopped.wait(max(0.0, self.every_s - (time.monotonic() - started)))

    def figures(self, phase):
        """Percentiles of the phase's answered pages; when the slowest was sent, in seconds
        from the phase's first."""
        pages = self.answers.get(phase, [])
        answered = sorted(seconds for _, seconds, status in pages if status is not None)
        if not answered:
            return {"pages": 0}
        slowest_sent = max((seconds, sent) for sent, seconds, status in pages
                           if status is not None)[1]
        return {"pages": len(answered),
                "page_p50_ms": round(percentile(answered, 50) * 1000),
                "page_p99_ms": round(percentile(answered, 99) * 1000),
                "page_max_ms": round(answered[-1] * 1000),
                "page_max_sent_at_s": round(slowest_sent - pages[0][0], 1),
                "page_errors": sum(1 for _, _, status in pages if status not in (200, None))}


class Tracker:
    def __init__(self):
        self.sent, self.acked = {}, {}  # event id -> time.time()
        self.errors = Counter()
        self.skipped = 0


class Pacer:
    """Samples at --sample-hz per node and events at `event_rate` over the fleet."""

    def __init__(self, agents, sample_hz, rng, args):
        self.agents, self.sample_hz, self.rng, self.args = agents, sample_hz, rng, args
        self.event_rate = 0.0
        self.tracker = agents[0].tracker

    async def run(self):
        agents, n = self.agents, len(self.agents)
        sample_index = event_index = 0
        start = time.monotonic()
        samples_issued = 0
        rate, events_start, events_issued = 0.0, start, 0
        while True:
            await asyncio.sleep(PACE_EVERY_S)
            now = time.monotonic()
            due = int((now - start) * self.sample_hz * n) - samples_issued
            samples_issued += max(due, 0)
            for _ in range(due):
                agent = agents[sample_index]
                sample_index = (sample_index + 1) % n
                if agent.silent_since is None and agent.welcomed and \
                        agent.ws.state.name == "OPEN":
                    agent.sample(now)
            if self.event_rate != rate:
                rate, events_start, events_issued = self.event_rate, now, 0
            due = int((now - events_start) * rate) - events_issued
            events_issued += max(due, 0)
            for _ in range(due):
                agent = agents[event_index]
                event_index = (event_index + 1) % n
                if agent.silent_since is not None or not agent.welcomed or \
                        agent.ws.state.name != "OPEN":
                    continue
                frame = agent.storm_event(self.rng, self.args.new, self.args.clear)
                if not agent.send_event(frame):
                    self.tracker.skipped += 1


class Processes:
    """The server (daphne, the agent gateway, or uvicorn with uvloop) on core 0; the workers,
    the beat, the publisher process (gateway-publisher: the gateway never leads) and this
    driver on core 1."""

    def __init__(self, workdir, server="daphne"):
        env = {**os.environ, "LOG_LEVEL": "WARNING", "CLUSTERUI_METRICS_TOKEN": METRICS_TOKEN}
        self.port = ingest.free_port()
        self.workdir = workdir
        specs = {
            "server": (0, server_argv(server, self.port)),
            # As README.md runs them: the sweeps alone, the recommender alone, the rest on
            # the other.
            "sweeps": (1, [PY, "-m", "celery", "-A", "clusterui", "worker", "--loglevel=WARNING",
                           "--concurrency=1", "--queues", "sweeps",
                           "--hostname", "bench-sweeps@%h"]),
            "recommend": (1, [PY, "-m", "celery", "-A", "clusterui", "worker",
                              "--loglevel=WARNING", "--concurrency=1", "--queues", "recommend",
                              "--hostname", "bench-recommend@%h"]),
            "worker": (1, [PY, "-m", "celery", "-A", "clusterui", "worker", "--loglevel=WARNING",
                           "--concurrency=1", "--queues", "celery,provider,notify",
                           "--hostname", "bench-worker@%h"]),
            "beat": (1, [PY, "-m", "celery", "-A", "clusterui", "beat", "--loglevel=WARNING",
                         "--schedule", str(workdir / "celerybeat-schedule")]),
        }
        # As scripts/demo.sh does: on the embedded SQLite broker, workers creating the queues
        # at the same moment can crash one of them (UNIQUE constraint failed: kombu_queue.name).
        subprocess.run([PY, "manage.py", "declare_task_queues"], cwd=REPO, env=env, check=True,
                       stdout=subprocess.DEVNULL)
        envs = {name: env for name in specs}
        if server == "gateway-publisher":  # README.md's production for large fleets
            envs["server"] = {**env, "CLUSTERUI_PUBLISHER_LEADS": "false"}
            specs["publisher"] = (1, [PY, "manage.py", "publisher"])
            envs["publisher"] = env
        self.procs = {}
        for name, (core, argv) in specs.items():
            logfile = open(workdir / f"{name}.log", "w")
            self.procs[name] = subprocess.Popen(ingest.pinned(core, argv), cwd=REPO,
                                                env=envs[name], stdout=logfile,
                                                stderr=subprocess.STDOUT)
        ingest.wait_for_port(self.port, self.procs["server"])
        self.ps = {name: psutil.Process(proc.pid) for name, proc in self.procs.items()}

    def cpu_s(self, name):
        """The process's CPU seconds, its children's (the worker's pool) included; 0 for a
        process this run has not (the publisher, but with gateway-publisher)."""
        total = 0.0
        root = self.ps.get(name)
        if root is None:
            return total
        for proc in [root, *root.children(recursive=True)]:
            try:
                times = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        return total

    def alive(self):
        return all(proc.poll() is None for proc in self.procs.values())

    def stop(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


ACTIVITY = """SELECT pid, state, wait_event_type, wait_event,
    round(extract(epoch FROM now() - xact_start)::numeric, 2), left(query, 160)
    FROM pg_stat_activity WHERE datname = current_database() AND state <> 'idle'
    AND pid <> pg_backend_pid() ORDER BY xact_start"""


SERVERS = ("daphne", "gateway", "gateway-publisher", "uvicorn")


def server_argv(kind, port):
    """daphne as README.md runs it, or uvicorn with uvloop (bench/ingest/run.py's)."""
    return ingest.server_argv("uvicorn-uvloop" if kind == "uvicorn" else kind, port,
                              SimpleNamespace(uvicorn_args="--log-level warning"))


def database_activity():
    """What PostgreSQL's sessions are doing now (pg_stat_activity), for the run's log;
    nothing in embedded mode (SQLite has no such view)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return []
    with connection.cursor() as cursor:
        cursor.execute(ACTIVITY)
        return cursor.fetchall()


def queue_depth_reader():
    """A function returning {queue: messages waiting}: Redis lists in production mode, the
    SQLite broker's visible messages (kombu's SQLAlchemy transport) in embedded mode."""
    from django.conf import settings

    if settings.REDIS_URL:
        client = redis.Redis.from_url(settings.REDIS_URL)
        return lambda: {queue: client.llen(queue) for queue in QUEUES}
    broker = settings.CELERY_BROKER_URL.removeprefix("sqla+sqlite:///")

    def sqlite_depths():
        depths = dict.fromkeys(QUEUES, 0)
        with sqlite3.connect(f"file:{broker}?mode=ro", uri=True, timeout=5) as db:
            try:
                rows = db.execute("SELECT q.name, count(*) FROM kombu_message m JOIN "
                                  "kombu_queue q ON m.queue_id = q.id WHERE m.visible "
                                  "GROUP BY q.name").fetchall()
            except sqlite3.OperationalError:  # no tables before the first message
                rows = []
        depths.update(rows)
        return depths

    return sqlite_depths


def server_ack_buckets(port):
    """{le: count} of the serving process's own ack histogram (gateway/series.py: from an
    event frame's arrival to its ack), read from its /metrics; `?cluster=` keeps a web
    process to the series of no cluster."""
    from prometheus_client.parser import text_string_to_metric_families

    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics?cluster=",
                                     headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    return {float(sample.labels["le"]): sample.value
            for family in text_string_to_metric_families(text) if family.name == ACK_HISTOGRAM
            for sample in family.samples if sample.name == f"{ACK_HISTOGRAM}_bucket"}


def server_ack_figures(before, after):
    """What the server itself timed over a step, from two readings of its histogram: the
    events acked, the bucket bound under which half and 99 % of them fall, and the share
    within 1 s. It starts at the frame's arrival in the server's loop, so time a frame waits
    in the socket's buffers for a busy loop is not in it (the driver's figures hold that)."""
    counts = {le: after[le] - before.get(le, 0) for le in sorted(after)}
    total = counts.get(float("inf"), 0)
    if not total:
        return {"acked": 0}

    def bound(share):
        le = next(le for le, count in counts.items() if count >= share * total)
        return "over 10 s" if le == float("inf") else f"<= {ms(le)} ms"

    return {"acked": int(total), "p50": bound(0.5), "p99": bound(0.99),
            "within_1s_pct": round(100 * counts[1.0] / total, 1)}


def ms(seconds):
    """Milliseconds; None where the rank fell on an event never acked."""
    return None if seconds is None or seconds == float("inf") else round(seconds * 1000)


async def measure_rate(rate, args, pacer, processes, queue_depth):
    tracker = pacer.tracker
    pacer.event_rate = rate
    await asyncio.sleep(args.warmup_s)
    spy = None
    if args.profile:  # py-spy on the server, 8 s of the step (bench/ingest/run.py's)
        spy = ingest.start_profile(SimpleNamespace(procs=[processes.procs["server"]]),
                                   args.server, rate, processes.workdir)
    t0, cpu0 = time.time(), {name: processes.cpu_s(name) for name in WORKERS}
    buckets0 = await asyncio.to_thread(server_ack_buckets, processes.port)
    skipped0, errors0 = tracker.skipped, Counter(tracker.errors)
    deepest = Counter()
    with open(processes.workdir / "database-activity.log", "a") as activity_log:
        while time.time() - t0 < args.step_s:
            await asyncio.sleep(0.5)
            for queue, depth in (await asyncio.to_thread(queue_depth)).items():
                deepest[queue] = max(deepest[queue], depth)
            rows = await asyncio.to_thread(database_activity)
            activity_log.write(f"--- {rate} events/s, {time.time() - t0:.1f} s into the step\n")
            activity_log.writelines(f"{row}\n" for row in rows)
    t1 = time.time()
    cpu1 = {name: processes.cpu_s(name) for name in WORKERS}
    if spy is not None:
        ingest.finish_profile(spy, processes.workdir)
    await asyncio.sleep(ACK_GRACE_S)
    buckets1 = await asyncio.to_thread(server_ack_buckets, processes.port)
    window = [event_id for event_id, at in tracker.sent.items() if t0 <= at < t1]
    latencies = sorted(tracker.acked[event_id] - tracker.sent[event_id]
                       for event_id in window if event_id in tracker.acked)
    offered = len(window) + tracker.skipped - skipped0
    unacked = len(window) - len(latencies)
    # An event not acked within the grace counts as slower than every acked one.
    ranked = latencies + [float("inf")] * unacked
    return {
        "rate": rate, "offered": offered, "acked": len(latencies),
        "acked_pct": round(100 * len(latencies) / offered, 1) if offered else None,
        "ack_p50_ms": ms(percentile(ranked, 50)) if ranked else None,
        "ack_p99_ms": ms(percentile(ranked, 99)) if ranked else None,
        "ack_max_ms": ms(latencies[-1]) if latencies else None,
        "server_ack": server_ack_figures(buckets0, buckets1),
        "deepest_queue": dict(deepest),
        "errors": dict(tracker.errors - errors0),
        "server_cpu_pct": round(100 * (cpu1["server"] - cpu0["server"]) / (t1 - t0)),
        "worker_cpu_pct": round(100 * (cpu1["worker"] - cpu0["worker"]) / (t1 - t0)),
        "sweeps_cpu_pct": round(100 * (cpu1["sweeps"] - cpu0["sweeps"]) / (t1 - t0)),
        "recommend_cpu_pct": round(100 * (cpu1["recommend"] - cpu0["recommend"]) / (t1 - t0)),
        "publisher_cpu_pct": round(100 * (cpu1["publisher"] - cpu0["publisher"]) / (t1 - t0)),
        "load": round(os.getloadavg()[0], 2),
    }


def heartbeat_events(node_ids, since):
    """{node_id: first_seen} of heartbeat_lost events opened since `since`."""
    from healthchecks.models import HealthEvent

    return dict(HealthEvent.objects.filter(signature="heartbeat_lost", node_id__in=node_ids,
                                           first_seen__gte=since)
                .values_list("node_id", "first_seen"))


def recommended_repair(node_id, since):
    from repairs.models import Repair

    return Repair.objects.filter(node_id=node_id, requested_at__gte=since).order_by("id").first()


def step_times(repair, since):
    """[(step, status, seconds from `since` to its start, to its end)] of the repair."""
    from repairs.models import RepairStep

    def after(at):
        return round(at.timestamp() - since, 2) if at else None

    return [(step.kind, step.status, after(step.started_at), after(step.finished_at))
            for step in RepairStep.objects.filter(repair=repair).order_by("position")]


def approve(repair):
    from django.contrib.auth import get_user_model

    from clusters.roles import Role, assign_role
    from repairs.services import do_approve_repair

    user, _ = get_user_model().objects.get_or_create(username="bench-operator")
    assign_role(user, Role.OPERATOR)
    return do_approve_repair(repair, actor=user, comment="bench/storm")


async def measure_loop(args, agents, fleet_ids, loop_timeout_s=120):
    """200 nodes go silent, one sends Xid 79; how fast the loop answers."""
    rng = random.Random(7)
    # A connection the storm closed (its events unacked: the real agent would send them
    # again on its next connection) takes no part.
    closed = Counter(agent.closed_with for agent in agents if agent.closed_with is not None)
    xid_agent, *others = [agent for agent in agents if agent.closed_with is None]
    silent = rng.sample(others, args.silent)
    for agent in silent:
        agent.silent_since = time.time()
    xid = protocol.event_frame(signature="xid:79", severity="critical",
                               message="GPU has fallen off the bus",
                               gpu_uuid=xid_agent.backend.gpus()[0]["uuid"],
                               detail={"source": "bench", "xid": 79})
    xid_sent = time.time()
    xid_agent.send_event(xid)
    xid_node = fleet_ids[xid_agent.node]
    silent_ids = {fleet_ids[agent.node]: agent for agent in silent}
    since = datetime.datetime.fromtimestamp(xid_sent - 1, tz=datetime.timezone.utc)
    repair = approved_at = command_at = None
    lost = {}
    deadline = time.time() + loop_timeout_s
    while time.time() < deadline:
        await asyncio.sleep(0.25)
        lost = await asyncio.to_thread(heartbeat_events, list(silent_ids), since)
        if repair is None:
            repair = await asyncio.to_thread(recommended_repair, xid_node, since)
            if repair is not None:
                await asyncio.to_thread(approve, repair)
                approved_at = time.time()
        elif command_at is None:
            command_at = next((at for at, frame in xid_agent.commands
                               if frame.get("action") == "reboot" and at >= approved_at), None)
        if len(lost) == len(silent_ids) and command_at is not None:
            break
    steps = await asyncio.to_thread(step_times, repair, approved_at) if repair else []
    delays = sorted(first_seen.timestamp() - silent_ids[node_id].last_sent
                    for node_id, first_seen in lost.items())
    return {
        "closed_during_the_storm": dict(closed),
        "silent": len(silent_ids), "heartbeat_lost": len(lost),
        "heartbeat_p50_s": round(percentile(delays, 50), 2) if delays else None,
        "heartbeat_p95_s": round(percentile(delays, 95), 2) if delays else None,
        "heartbeat_max_s": round(delays[-1], 2) if delays else None,
        "recommendation_s": round(repair.requested_at.timestamp() - xid_sent, 2)
        if repair else None,
        "repair_action": repair.action if repair else None,
        "approve_to_reboot_command_s": round(command_at - approved_at, 2)
        if command_at else None,
        "repair_steps_after_approval_s": steps,
    }


async def drain(tracker, limit_s):
    """Seconds until every event sent is acked (the server's backlog is gone), or None."""
    started = time.time()
    while time.time() - started < limit_s:
        if len(tracker.acked) >= len(tracker.sent):
            return time.time() - started
        await asyncio.sleep(0.5)
    return None


async def run(args, fleet, processes, queue_depth):
    tracker = Tracker()
    node_metrics = loadgen.NodeMetrics()
    await asyncio.sleep(0.2)
    node_metrics = node_metrics.read()
    url = f"ws://127.0.0.1:{processes.port}/ws/agent/"
    agents = [StormAgent(entry["node"], entry["token"], url, node_metrics, tracker=tracker)
              for entry in fleet["nodes"]]
    limit = asyncio.Semaphore(loadgen.SETUP_CONCURRENCY)
    rng = random.Random(2)
    failed_handshakes = []

    async def start(agent):
        if fleet["join"]:  # all at once, as a cluster powering on
            failed_handshakes.append(await connect_as_the_agent(agent, rng))
            return
        async with limit:
            await agent.start(None)

    # A person's page meanwhile: the server's /healthz (in embedded mode, a Django view that
    # reads the database, served by the one process that also serves the agents).
    pages = PagePoller(f"http://127.0.0.1:{processes.port}/healthz")
    pages.phase = "join" if fleet["join"] else "connect"
    pages.thread.start()
    # As a real agent does, each samples from its welcome on, while the others connect.
    pacer = Pacer(agents, 1.0, random.Random(1), args)
    pacing = asyncio.get_running_loop().create_task(pacer.run())
    started = time.monotonic()
    await asyncio.gather(*(start(agent) for agent in agents))
    joined = {"nodes": len(agents), "welcomed_in_s": round(time.monotonic() - started, 1),
              "failed_handshakes": sum(failed_handshakes),
              "hellos_said_again": sum(agent.hellos_again for agent in agents),
              **pages.figures(pages.phase)}
    log(f"{len(agents)} agents welcomed in {joined['welcomed_in_s']} s"
        + (f" (joined: {json.dumps(joined)})" if fleet["join"] else ""))
    await asyncio.sleep(args.settle_s)
    steps = []
    try:
        for rate in args.rates:
            pages.phase = rate
            step = await measure_rate(rate, args, pacer, processes, queue_depth)
            step["pages"] = pages.figures(rate)
            log(step_line(step) + f", pages {json.dumps(step['pages'])}")
            steps.append(step)
            if not processes.alive():
                log("a server process exited; see its log")
                break
        pacer.event_rate = 0
        drained = await drain(tracker, args.drain_s)
        log(f"events stopped; every event sent was acked {drained:.1f} s later"
            if drained is not None else f"events stopped; {args.drain_s:g} s later events "
            f"sent were still not acked")
        fleet_ids = await asyncio.to_thread(node_ids)
        loop_figures = await measure_loop(args, agents, fleet_ids)
        log(json.dumps(loop_figures))
    finally:
        pages.stopped.set()
        pacing.cancel()
        await asyncio.gather(*(agent.ws.close() for agent in agents), return_exceptions=True)
    if fleet["join"]:
        loop_figures["joined"] = joined
    return steps, loop_figures


def node_ids():
    """{node name: id} of the bench cluster (joined nodes have theirs only now)."""
    from nodes.models import Node

    return dict(Node.objects.filter(cluster__slug=SLUG).values_list("name", "id"))


def step_line(s):
    return (f"{s['rate']:>5} events/s: acked {s['acked']}/{s['offered']} ({s['acked_pct']} %), "
            f"ack p50 {s['ack_p50_ms']} ms p99 {s['ack_p99_ms']} ms max {s['ack_max_ms']} ms, "
            f"as the server timed them {json.dumps(s['server_ack'])}, "
            f"deepest queue {s['deepest_queue']}, errors {s['errors']}, "
            f"server {s['server_cpu_pct']} % worker {s['worker_cpu_pct']} % sweeps "
            f"{s['sweeps_cpu_pct']} % recommender {s['recommend_cpu_pct']} % publisher "
            f"{s['publisher_cpu_pct']} %, load {s['load']}")


def table(steps):
    lines = ["| events/s | acked/offered | ack p50 | ack p99 | the server's own p50 / p99 "
             "(within 1 s) | deepest queue | server CPU | worker CPU | sweeps CPU | "
             "recommender CPU | publisher CPU |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for s in steps:
        deepest = max(s["deepest_queue"].values(), default=0)
        server = s["server_ack"]
        own = (f"{server['p50']} / {server['p99']} ({server['within_1s_pct']} %)"
               if server["acked"] else "-")
        lines.append(f"| {s['rate']} | {s['acked']}/{s['offered']} ({s['acked_pct']} %) | "
                     f"{s['ack_p50_ms']} ms | {s['ack_p99_ms']} ms | {own} | {deepest} | "
                     f"{s['server_cpu_pct']} % | {s['worker_cpu_pct']} % | "
                     f"{s['sweeps_cpu_pct']} % | {s['recommend_cpu_pct']} % | "
                     f"{s['publisher_cpu_pct']} % |")
    return "\n".join(lines)


def prepare(fleet_path, join):
    """The bench cluster without acceptance tests, repairs through the simulated provider
    (the reboot is a command to the agent) and no blast-radius limit. With `join` new nodes
    instead of the fleet's, each to say hello with one join token: the fleet, as run() takes
    it."""
    import django

    django.setup()
    from clusters.models import Cluster
    from nodes.models import Node
    from nodes.services import do_issue_join_token
    from repairs.models import RepairSettings

    cluster = Cluster.objects.get(slug=SLUG)
    Cluster.objects.filter(pk=cluster.pk).update(acceptance_tests_enabled=False)
    Node.objects.filter(cluster=cluster).update(acceptance_required=False)
    RepairSettings.objects.update_or_create(
        cluster=cluster, defaults={"provider": "simulated", "blast_radius_pct": 100})
    fleet = json.loads(fleet_path.read_text())
    if join:
        join_token = do_issue_join_token(cluster)[1]
        fleet["nodes"] = [{"node": f"bench-join-{n:05d}", "token": join_token}
                          for n in range(join)]
    fleet["join"] = bool(join)
    return fleet


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--rates", default="100,200,500,1000,1500,2000",
                        type=lambda s: [int(n) for n in s.split(",")])
    parser.add_argument("--step-s", type=float, default=20.0, help="measured seconds a step")
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--settle-s", type=float, default=15.0,
                        help="samples only, after every agent was welcomed")
    parser.add_argument("--drain-s", type=float, default=180.0,
                        help="after the steps, at most this long for every event to be acked")
    parser.add_argument("--silent", type=int, default=200)
    parser.add_argument("--new", type=float, default=0.2, help="share of new signatures")
    parser.add_argument("--clear", type=float, default=0.15, help="share of `cleared`")
    parser.add_argument("--profile", action="store_true",
                        help="py-spy on the server for 8 s of each step (its summary is printed)")
    parser.add_argument("--server", choices=SERVERS, default="daphne",
                        help="what serves the agent socket (uvicorn: with uvloop)")
    parser.add_argument("--join", action="store_true",
                        help="the nodes are new: they join at once with a join token")
    parser.add_argument("--out", help="write the results as JSON here too")
    args = parser.parse_args()
    workdir = Path(os.environ.get("BENCH_WORKDIR") or "/tmp")
    began = time.monotonic()

    subprocess.run([PY, "manage.py", "migrate", "-v0"], cwd=REPO, check=True, timeout=600)
    fleet_path = workdir / "fleet.json"
    subprocess.run([PY, str(INGEST / "fleet.py"), "--nodes",
                    str(0 if args.join else args.nodes), "--out", str(fleet_path)],
                   cwd=REPO, check=True, timeout=600)
    fleet = prepare(fleet_path, args.nodes if args.join else 0)
    processes = Processes(workdir, args.server)
    try:
        steps, loop_figures = asyncio.run(run(args, fleet, processes, queue_depth_reader()))
    finally:
        processes.stop()

    print()
    mode = os.environ.get("CLUSTERUI_MODE", "embedded")
    print(f"storm bench, {datetime.date.today()}, {os.cpu_count()} cores, {mode} mode, "
          f"{args.server} x1, workers x2 (sweeps, the rest), {args.nodes} nodes at 1 Hz"
          f"{' (joined at once)' if args.join else ''}, "
          f"{args.step_s:g} s a step; {time.monotonic() - began:.0f} s in all")
    print(" ".join(sys.argv))
    print(table(steps))
    print("after the storm:", json.dumps(loop_figures))
    results = {"argv": sys.argv, "date": str(datetime.date.today()), "steps": steps,
               "loop": loop_figures}
    (workdir / "results.json").write_text(json.dumps(results, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
