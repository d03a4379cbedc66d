"""The reconnect benchmark: a server restart drops every agent connection at once; how long
until all are welcomed again? Then a thousand new nodes join at once.

    bench/reconnect/run.sh [--nodes 4000] [--sample-hz 1] [--join 1000] [--acceptance]

Production mode (bench/reconnect/run.sh: a throwaway PostgreSQL and Redis), one daphne on
core 0; this driver on core 1 holds every node's agent connection (bench/storm/run.py's
agent: hello with 8 simulated H200s, samples at --sample-hz from its welcome on). Once all
are welcomed, daphne is killed (SIGKILL: every socket drops at once) and started again on
the same port. Each agent reconnects as the real one does (agent.connection.client: the backoff
delays of agent.connection.client.backoff_delay, full jitter from 1 s doubling to 30 s; a connect
gives up after 10 s, a welcome after 30 s from the hello or from
the last answer that asked for it again). It prints, from the moment the new daphne
listens, the time until each agent's welcome: p50, p99, max, and how many were welcomed,
and the server's CPU meanwhile, per reconnect (with --sample-hz 0: the reconnects alone).
Targets (issue 25): all 4,000 within 30 s; a known node's reconnect at most 5 ms of CPU.

Then (--join N) N new nodes join at once with one join token, each as the agent does (a
connect gives up after 10 s and is tried again after the agent's backoff; a hello answered
rate_limited is said again after retry_after_s): the handshakes that failed, the hellos
answered rate_limited, and the time until all N were welcomed. Target: none failed.

Throughout both, a person's page: GET /healthz (a Django view that reads PostgreSQL and
Redis) every 0.2 s from a thread of its own; its p50/p99/max latency per phase. Target:
within a second.
"""

import argparse
import asyncio
import datetime
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
sys.path.insert(0, str(REPO))


from bench.storm import run as storm  # noqa: E402
ingest, loadgen, log, percentile = storm.ingest, storm.loadgen, storm.log, storm.percentile

from agent.connection.client import WELCOME_TIMEOUT_S, backoff_delay  # noqa: E402

CONNECT_TIMEOUT_S = storm.CONNECT_TIMEOUT_S


class ReconnectingAgent(storm.StormAgent):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.welcomes = []  # time.time() of each welcome

    async def keep_connected(self, rng, attempt):
        """Connect, hello, welcome, until the socket closes; then the agent's backoff."""
        while True:
            try:
                await self.start(None, open_timeout=CONNECT_TIMEOUT_S,
                                 welcome_timeout=WELCOME_TIMEOUT_S)
                self.welcomes.append(time.time())
                await self.ws.wait_closed()
            except Exception:  # noqa: BLE001 - refused, timed out, closed: retry as the agent
                pass
            self.welcomed = False
            await asyncio.sleep(backoff_delay(attempt, rng))
            attempt += 1


def issue_join_token(acceptance):
    """A join token of the bench cluster (bench/storm/run.py prepared Django); with
    `acceptance`, the cluster runs its acceptance battery on the nodes that join (a new
    cluster powering on): each join also asks for the battery's checks, which the bench's
    agents leave unanswered, so they stay pending."""
    from clusters.models import Cluster
    from nodes.services import do_issue_join_token

    cluster = Cluster.objects.get(slug=storm.SLUG)
    Cluster.objects.filter(pk=cluster.pk).update(acceptance_tests_enabled=acceptance)
    return do_issue_join_token(cluster)[1]


async def join_storm(url, join_token, count, node_metrics):
    """`count` new nodes join at once, each as the agent does; their figures."""
    tracker = storm.Tracker()
    agents = [ReconnectingAgent(f"bench-join-{n:05d}", join_token, url, node_metrics,
                                tracker=tracker) for n in range(count)]
    rng = random.Random(3)
    started = time.time()

    async def join(agent):
        failed = await storm.connect_as_the_agent(agent, rng)
        agent.welcomes.append(time.time())
        return failed

    failed_handshakes = sum(await asyncio.gather(*(join(agent) for agent in agents)))
    welcomed = sorted(agent.welcomes[0] - started for agent in agents)
    await asyncio.gather(*(agent.ws.close() for agent in agents), return_exceptions=True)
    return {"joined": len(welcomed), "failed_handshakes": failed_handshakes,
            "join_p50_s": round(percentile(welcomed, 50), 1),
            "join_all_s": round(welcomed[-1], 1),
            "hellos_said_again": sum(agent.hellos_again for agent in agents)}


def start_server(kind, port, workdir, n):
    logfile = open(workdir / f"{kind}-{n}.log", "w")
    argv = ingest.pinned(0, storm.server_argv(kind, port))
    proc = subprocess.Popen(argv, cwd=REPO, env={**os.environ, "LOG_LEVEL": "WARNING"},
                            stdout=logfile, stderr=subprocess.STDOUT)
    return proc


def cpu_s(proc):
    """The process's CPU seconds so far (user and system)."""
    times = psutil.Process(proc.pid).cpu_times()
    return times.user + times.system


def listening(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


async def wait_listening(port, proc):
    while not listening(port):
        if proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode})")
        await asyncio.sleep(0.05)
    return time.time()


async def run(args, fleet, port, workdir, join_token):
    tracker = storm.Tracker()
    node_metrics = loadgen.NodeMetrics()
    await asyncio.sleep(0.2)
    node_metrics = node_metrics.read()
    url = f"ws://127.0.0.1:{port}/ws/agent/"
    agents = [ReconnectingAgent(entry["node"], entry["token"], url, node_metrics,
                                tracker=tracker) for entry in fleet["nodes"]]
    server = start_server(args.server, port, workdir, 1)
    await wait_listening(port, server)
    pacer = storm.Pacer(agents, args.sample_hz, random.Random(1),
                        argparse.Namespace(new=0, clear=0))
    tasks = [asyncio.get_running_loop().create_task(pacer.run())]
    # The first connections come in at a steady pace (a fleet that was up), not as a storm.
    limit = asyncio.Semaphore(loadgen.SETUP_CONCURRENCY)

    async def first_connect(agent):
        async with limit:
            await agent.start(None)
        agent.welcomes.append(time.time())

    started = time.monotonic()
    await asyncio.gather(*(first_connect(agent) for agent in agents))
    log(f"{len(agents)} agents welcomed in {time.monotonic() - started:.1f} s; "
        f"{args.settle_s:g} s of samples")
    web, web_port = None, port
    if args.server == "gateway":
        # Pages come from a web process, as in production: daphne on core 1 (the gateway
        # took the publisher's lease first; the web process takes it while the gateway is
        # down, and the tick then runs there).
        web_port = ingest.free_port()
        web = subprocess.Popen(ingest.pinned(1, storm.server_argv("daphne", web_port)),
                               cwd=REPO, env={**os.environ, "LOG_LEVEL": "WARNING"},
                               stdout=open(workdir / "web.log", "w"), stderr=subprocess.STDOUT)
        await wait_listening(web_port, web)
    pages = storm.PagePoller(f"http://127.0.0.1:{web_port}/healthz")
    pages.thread.start()
    await asyncio.sleep(args.settle_s)
    idle_pages = pages.figures("idle")
    rng = random.Random(2)

    async def after_first(agent):
        await agent.ws.wait_closed()
        agent.welcomed = False
        await asyncio.sleep(backoff_delay(0, rng))
        await agent.keep_connected(rng, attempt=1)

    tasks += [asyncio.get_running_loop().create_task(after_first(agent)) for agent in agents]
    pages.phase = "reconnect"
    hellos_again_before = sum(agent.hellos_again for agent in agents)
    server.send_signal(signal.SIGKILL)
    server.wait()
    killed_at = time.time()
    server = start_server(args.server, port, workdir, 2)
    listening_at = await wait_listening(port, server)
    cpu_at_listening = cpu_s(server)
    log(f"{args.server} killed and started again: listening {listening_at - killed_at:.1f} s later")
    deadline = listening_at + args.limit_s
    while time.time() < deadline:
        if all(any(at > killed_at for at in agent.welcomes) for agent in agents):
            break
        await asyncio.sleep(0.25)
    # From listening to the last welcome: the handshakes, the token checks, the hellos, the
    # configs, and whatever else the server did meanwhile (the samples of the agents back,
    # pings); with --sample-hz 0, the reconnects alone.
    reconnect_cpu_s = cpu_s(server) - cpu_at_listening
    reconnect_wall_s = time.time() - listening_at
    hellos_said_again = sum(agent.hellos_again for agent in agents) - hellos_again_before
    back = sorted(min(at for at in agent.welcomes if at > killed_at) - listening_at
                  for agent in agents if any(at > killed_at for at in agent.welcomes))
    reconnect_pages = pages.figures("reconnect")
    log(f"{len(back)} of {len(agents)} welcomed again: p50 {percentile(back, 50):.1f} s, "
        f"p99 {percentile(back, 99):.1f} s, max {back[-1]:.1f} s; pages {reconnect_pages}")
    joined = {}
    if args.join:
        pages.phase = "join"
        joined = await join_storm(url, join_token, args.join, node_metrics)
        joined.update(pages.figures("join"))
        log(f"join storm: {joined}")
    pages.stopped.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*(agent.ws.close() for agent in agents), return_exceptions=True)
    for process in (server, web):
        if process is None:
            continue
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
    return {
        "nodes": len(agents), "welcomed_again": len(back),
        "p50_s": round(percentile(back, 50), 1) if back else None,
        "p99_s": round(percentile(back, 99), 1) if back else None,
        "max_s": round(back[-1], 1) if back else None,
        "restart_s": round(listening_at - killed_at, 1),
        "hellos_said_again": hellos_said_again,
        "server_cpu_s": round(reconnect_cpu_s, 2),
        "server_core_share": round(reconnect_cpu_s / reconnect_wall_s, 2),
        "server_cpu_ms_per_reconnect": round(reconnect_cpu_s / len(back) * 1e3, 2) if back else None,
        "limit_s": args.limit_s,
        "idle": idle_pages,
        "reconnect_pages": reconnect_pages,
        "join": joined,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4000)
    parser.add_argument("--sample-hz", type=float, default=1.0)
    # (Not gateway-publisher: this bench restarts one server process, which then leads.)
    parser.add_argument("--server", choices=[s for s in storm.SERVERS
                                             if s != "gateway-publisher"], default="daphne",
                        help="what serves the agent socket (uvicorn: with uvloop)")
    parser.add_argument("--settle-s", type=float, default=10.0)
    parser.add_argument("--join", type=int, default=1000,
                        help="new nodes that join at once after the reconnect (0: none)")
    parser.add_argument("--acceptance", action="store_true",
                        help="the joining nodes run the cluster's acceptance battery")
    parser.add_argument("--limit-s", type=float, default=180.0,
                        help="after the restart, at most this long for the agents to come back")
    args = parser.parse_args()
    workdir = Path(os.environ.get("BENCH_WORKDIR") or "/tmp")
    subprocess.run([PY, "manage.py", "migrate", "-v0"], cwd=REPO, check=True, timeout=600)
    fleet_path = workdir / "fleet.json"
    subprocess.run([PY, str(REPO / "bench" / "ingest" / "fleet.py"), "--nodes",
                    str(args.nodes), "--out", str(fleet_path)], cwd=REPO, check=True,
                   timeout=600)
    fleet = storm.prepare(fleet_path, join=0)
    join_token = issue_join_token(args.acceptance)
    figures = asyncio.run(run(args, fleet, ingest.free_port(), workdir, join_token))
    print()
    print(f"reconnect bench, {datetime.date.today()}, {os.cpu_count()} cores, production "
          f"mode, {args.server} x1, {args.nodes} nodes, samples at {args.sample_hz:g} Hz"
          f"{', the joins run acceptance' if args.acceptance else ''}")
    print(" ".join(sys.argv))
    print(json.dumps(figures))
    (workdir / "results.json").write_text(json.dumps({"argv": sys.argv, **figures}, indent=1))


if __name__ == "__main__":
    main()
