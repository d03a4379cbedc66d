"""The ingest benchmark's driver (bench/README.md). Run it through bench/ingest/run.sh,
which starts the throwaway PostgreSQL and Redis and sets production mode.

For each server configuration: start the server process(es) pinned to core 0 (a second
one on core 1), start the load generator (bench/ingest/loadgen.py) on core 1 with N
connections, and step the offered rate up. At each step, after a warm-up, it measures for
--step-s seconds:
  delivered  samples the server recorded in its live store (the Redis counter
             clusterui:live:recorded that RedisLiveStore.flush() adds to), over the frames
             the load generator offered (sent, plus skipped because the socket was full)
  latency    p50/p99 from a frame's `ts` (set at send) to its entry in the Redis live
             store: a poller reads PROBE_NODES nodes' entries every POLL_S and notes each
             new `ts` (so it includes the store's flush, every 50 ms; resolution POLL_S)
  CPU        the server processes' user+system CPU time over the window (psutil), per
             delivered sample, and as a percent of one core; the load generator's too
Server `gateway-publisher` is the agent gateway with CLUSTERUI_PUBLISHER_LEADS=false beside
`manage.py publisher` (on core 1, its CPU reported apart), which folds the gateway's samples.
"Sustained" is the highest offered rate with >= 97 % delivered and p99 under 200 ms
(shared/notes/ingest-performance.md). After a failing step it pauses until the server's
backlog drained; after --stop-after failing steps it stops.
"""

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psutil
import redis

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PY = sys.executable

LIVE_KEY = "clusterui:live:{cluster_id}"
RECORDED_KEY = "clusterui:live:recorded"
BARE_RECORDED_KEY = "bench:bare:recorded"
BARE_LATENCY_KEY = "bench:bare:latency_ms"
PROBE_NODES = 64
POLL_S = 0.02
TS_IN_ENTRY = re.compile(rb'"ts": ?([-0-9.eE+]+)')
DELIVERED_MIN = 0.97
P99_MAX_S = 0.200

SERVERS = ("daphne", "gateway", "gateway-publisher", "uvicorn", "uvicorn-uvloop", "bare",
           "bare-orjson", "bare-orjson-uvloop")


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, proc, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server on port {port} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"server on port {port} did not listen within {timeout_s} s")


def pinned(core, argv):
    return ["taskset", "-c", str(core), *argv] if pinning() else argv


def pinning():
    return (os.cpu_count() or 1) >= 2 and shutil.which("taskset") is not None


def server_argv(kind, port, args):
    if kind == "daphne":  # as README.md runs it in production
        return [PY, "-m", "daphne", "-e", f"tcp:port={port}:interface=127.0.0.1:backlog=4096",
                "clusterui.asgi:application"]
    if kind in ("gateway", "gateway-publisher"):  # the agent gateway (gateway/server.py)
        return [PY, "manage.py", "agent_gateway", "--bind", "127.0.0.1", "--port", str(port)]
    if kind.startswith("uvicorn"):
        loop = "uvloop" if kind == "uvicorn-uvloop" else "asyncio"
        return [PY, "-m", "uvicorn", "clusterui.asgi:application", "--host", "127.0.0.1",
                "--port", str(port), "--lifespan", "off", "--loop", loop,
                *args.uvicorn_args.split()]
    decoder = "orjson" if kind.startswith("bare-orjson") else "json"
    loop = "uvloop" if kind.endswith("-uvloop") else "asyncio"
    return [PY, str(HERE / "bare_server.py"), "--port", str(port),
            "--redis-url", os.environ["REDIS_URL"], "--decoder", decoder, "--loop", loop]


class LatencyPoller(threading.Thread):
    """Reads the probe nodes' live entries every POLL_S; a new `ts` is one observation."""

    def __init__(self, client, key, node_ids):
        super().__init__(daemon=True)
        self.client, self.key, self.node_ids = client, key, node_ids
        self.observations = []  # (ts, seen_at - ts)
        self.running = True

    def run(self):
        last = {}
        while self.running:
            values = self.client.hmget(self.key, self.node_ids)
            seen_at = time.time()
            for node_id, raw in zip(self.node_ids, values):
                if raw is None:
                    continue
                match = TS_IN_ENTRY.search(raw)
                if match is None:
                    continue
                ts = float(match.group(1))
                if last.get(node_id) != ts:
                    last[node_id] = ts
                    self.observations.append((ts, seen_at - ts))
            time.sleep(POLL_S)

    def between(self, start, end):
        return sorted(latency for ts, latency in self.observations if start <= ts < end)


def dump_latencies(poller, start, end, path):
    """(ts, latency) of each observation, and the worst second's p99, for a look later."""
    rows = [(ts, lat) for ts, lat in poller.observations if start <= ts < end]
    path.write_text("ts,latency_s\n" + "".join(f"{ts:.3f},{lat:.4f}\n" for ts, lat in rows))


def percentile(values, pct):
    if not values:
        return None
    return values[min(len(values) - 1, int(len(values) * pct / 100))]


def histogram_percentile(histogram, pct):
    total = sum(histogram.values())
    if not total:
        return None
    rank, seen = total * pct / 100, 0
    for ms in sorted(histogram):
        seen += histogram[ms]
        if seen > rank:
            return (ms + 0.5) / 1000
    return max(histogram) / 1000


class Servers:
    """The server processes measured. gateway-publisher: agent gateways that never lead the
    publisher, and `manage.py publisher` beside them on the load generator's core, which
    folds their samples; its CPU is reported apart (publisher_cpu_s)."""

    def __init__(self, kind, processes, args, workdir):
        self.kind, self.procs, self.ports = kind, [], []
        env = {**os.environ, "LOG_LEVEL": "WARNING"}
        self.publisher = None
        if kind == "gateway-publisher":
            env["CLUSTERUI_PUBLISHER_LEADS"] = "false"
            self.publisher = subprocess.Popen(
                pinned(1, [PY, "manage.py", "publisher"]), cwd=REPO,
                env={**os.environ, "LOG_LEVEL": "WARNING"},
                stdout=open(workdir / "publisher.log", "w"), stderr=subprocess.STDOUT)
            self.publisher_ps = psutil.Process(self.publisher.pid)
        for i in range(processes):
            port = free_port()
            logfile = open(workdir / f"{kind}-{i}.log", "w")
            if args.stalls:  # bench/ingest/stalls/sitecustomize.py
                env = {**env, "PYTHONPATH": str(HERE / "stalls"),
                       "BENCH_STALLS_LOG": str(workdir / f"stalls-{kind}-x{processes}-{i}.log")}
            argv = pinned(i % 2, server_argv(kind, port, args))
            self.procs.append(subprocess.Popen(argv, cwd=REPO, env=env, stdout=logfile,
                                               stderr=subprocess.STDOUT))
            self.ports.append(port)
        for port, proc in zip(self.ports, self.procs):
            wait_for_port(port, proc)
        self.ps = [psutil.Process(p.pid) for p in self.procs]

    def cpu_s(self, first_only=False):
        total = 0.0
        for p in self.ps[:1] if first_only else self.ps:
            t = p.cpu_times()
            total += t.user + t.system
        return total

    def publisher_cpu_s(self):
        if self.publisher is None:
            return 0.0
        t = self.publisher_ps.cpu_times()
        return t.user + t.system

    def rss_mb(self):
        return sum(p.memory_info().rss for p in self.ps) / 2**20

    def alive(self):
        return all(p.poll() is None for p in self.procs + [self.publisher] if p is not None)

    def stop(self):
        for p in self.procs + ([self.publisher] if self.publisher is not None else []):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs + ([self.publisher] if self.publisher is not None else []):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class LoadGenProcess:
    def __init__(self, fleet_path, ports, connections, compression):
        argv = pinned(1, [PY, str(HERE / "loadgen.py"), "--fleet", str(fleet_path),
                          "--ports", ",".join(map(str, ports)),
                          "--connections", str(connections), "--compression", compression])
        self.proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)

    def read(self):
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the load generator exited ({self.proc.wait()})")
        return json.loads(line)

    def ask(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.read()

    def stop(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(20)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def profile_summary(raw_path, out_path, top=30):
    """py-spy's raw (collapsed) stacks -> self and inclusive time by function and by package."""
    own, inclusive, packages = Counter(), Counter(), Counter()
    total = 0
    for line in Path(raw_path).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        count = int(count)
        total += count
        frames = [re.sub(r":\d+\)$", ")", frame) for frame in stack.split(";")]
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
        packages[package_of(frames[-1])] += count
    lines = [f"{total} samples (CPU only: idle waits are not sampled)", "",
             "self time by package:"]
    lines += [f"  {100 * n / total:5.1f} %  {name}" for name, n in packages.most_common(top)]
    lines += ["", "self time by function:"]
    lines += [f"  {100 * n / total:5.1f} %  {name}" for name, n in own.most_common(top)]
    lines += ["", "inclusive time by function:"]
    lines += [f"  {100 * n / total:5.1f} %  {name}" for name, n in inclusive.most_common(top)]
    Path(out_path).write_text("\n".join(lines) + "\n")
    return lines


def package_of(frame):
    """'function (path/to/file.py:12)' -> a short package name."""
    match = re.search(r"\((.*?)(?::\d+)?\)$", frame)
    path = match.group(1) if match else frame
    if "site-packages/" in path:
        return path.split("site-packages/")[1].split("/")[0]
    if "/python3." in path:
        return "stdlib:" + path.split("/python3.")[1].split("/", 1)[-1].split("/")[0]
    if path.startswith(str(REPO)):
        return "clusterui:" + path.replace(str(REPO) + "/", "")
    return path


def measure_config(kind, processes, args, fleet, fleet_path, client, workdir):
    name = f"{kind} x{processes}"
    log(f"{name}: starting")
    bare = kind.startswith("bare")
    recorded_key = BARE_RECORDED_KEY if bare else RECORDED_KEY
    servers = Servers(kind, processes, args, workdir)
    idle_cpu_pct = None
    loadgen = None
    poller = None
    steps = []
    try:
        loadgen = LoadGenProcess(fleet_path, servers.ports, args.connections, args.compression)
        ready = loadgen.read()
        log(f"{name}: {ready['ready']} connections open in {ready['setup_s']} s, "
            f"frames of {ready['frame_bytes']} bytes")
        if not bare:
            nodes = fleet["nodes"][: args.connections]
            step = max(1, len(nodes) // PROBE_NODES)
            probe = [str(n["node_id"]) for n in nodes[::step]][:PROBE_NODES]
            poller = LatencyPoller(client, LIVE_KEY.format(cluster_id=fleet["cluster_id"]),
                                   probe)
            poller.start()
        # Connected and silent: what the server spends on a fleet before any sample (the
        # publisher's tick, pings), which should not grow with the fleet.
        time.sleep(args.warmup_s)
        a_cpu = servers.cpu_s()
        time.sleep(args.step_s)
        idle_cpu_pct = 100 * (servers.cpu_s() - a_cpu) / args.step_s
        log(f"{name}: {idle_cpu_pct:.1f} % of a core with {args.connections} connections "
            f"and no samples")
        # The hellos' database work and the publisher's first ticks (a fleet it never saw)
        # are not what is measured: settle at the first rate.
        loadgen.ask(f"rate {args.rates[0]}")
        time.sleep(args.settle_s)
        fails = 0
        for rate in args.rates:
            loadgen.ask(f"rate {rate}")
            time.sleep(args.warmup_s)
            spy = start_profile(servers, kind, rate, workdir) if args.profile else None
            a_lg, a_cpu, a_rec = loadgen.ask("stats"), servers.cpu_s(), counter(client, recorded_key)
            a_pub = servers.publisher_cpu_s()
            a_core0 = core0_busy_s() - servers.cpu_s(first_only=True)
            a_hist = bare_histogram(client) if bare else None
            time.sleep(args.step_s)
            b_lg, b_cpu, b_rec = loadgen.ask("stats"), servers.cpu_s(), counter(client, recorded_key)
            b_pub = servers.publisher_cpu_s()
            b_core0 = core0_busy_s() - servers.cpu_s(first_only=True)
            b_hist = bare_histogram(client) if bare else None
            window = b_lg["at"] - a_lg["at"]
            offered = sum(b_lg[k] - a_lg[k] for k in ("sent", "skipped", "lost"))
            delivered = b_rec - a_rec
            if bare:
                hist = {ms: b_hist.get(ms, 0) - a_hist.get(ms, 0) for ms in b_hist}
                p50, p99 = histogram_percentile(hist, 50), histogram_percentile(hist, 99)
                n_lat = sum(hist.values())
                max_ms = max((ms for ms, n in hist.items() if n), default=None)
            else:
                lat = poller.between(a_lg["at"], b_lg["at"] - 0.5)
                p50, p99, n_lat = percentile(lat, 50), percentile(lat, 99), len(lat)
                max_ms = 1000 * lat[-1] if lat else None
                dump_latencies(poller, a_lg["at"], b_lg["at"] - 0.5,
                               workdir / f"latency-{kind}-x{processes}-{rate}.csv")
            result = {
                "server": kind, "processes": processes, "rate": rate,
                "offered_per_s": offered / window, "delivered_per_s": delivered / window,
                "delivered_pct": 100 * delivered / offered if offered else 0.0,
                "skipped": b_lg["skipped"] - a_lg["skipped"], "lost": b_lg["lost"] - a_lg["lost"],
                "p50_ms": None if p50 is None else 1000 * p50,
                "p99_ms": None if p99 is None else 1000 * p99, "latency_n": n_lat,
                "max_ms": max_ms,
                "cpu_us_per_report": 1e6 * (b_cpu - a_cpu) / delivered if delivered else None,
                "server_cpu_pct": 100 * (b_cpu - a_cpu) / window,
                "loadgen_cpu_pct": 100 * (b_lg["cpu_s"] - a_lg["cpu_s"]) / window,
                "publisher_cpu_pct": 100 * (b_pub - a_pub) / window,
                "open": b_lg["open"], "errors": b_lg["errors"], "rss_mb": servers.rss_mb(),
                # Other engineers' processes the scheduler put on the server's core: a step
                # where they took much of it measured the machine, not the server.
                "core0_others_pct": 100 * (b_core0 - a_core0) / window,
                "loadavg_1m": os.getloadavg()[0],
            }
            result["ok"] = (result["delivered_pct"] >= 100 * DELIVERED_MIN and p99 is not None
                            and p99 < P99_MAX_S)
            steps.append(result)
            log(f"{name}: {row(result)}")
            if spy is not None:
                finish_profile(spy, workdir)
            if not servers.alive():
                log(f"{name}: a server process exited; see {workdir}")
                break
            if not result["ok"]:
                fails += 1
                if fails >= args.stop_after:
                    break
                drain(loadgen, client, recorded_key)
    finally:
        if poller is not None:
            poller.running = False
        if loadgen is not None:
            loadgen.stop()
        servers.stop()
    sustained = max((s["rate"] for s in steps if s["ok"]), default=0)
    peak = max((s["delivered_per_s"] for s in steps), default=0)
    marginal_us, fixed_pct = cpu_fit(steps)
    log(f"{name}: sustained {sustained}/s, peak delivered {peak:.0f}/s")
    return {"server": kind, "processes": processes, "sustained": sustained,
            "peak_delivered_per_s": peak, "marginal_cpu_us": marginal_us,
            "fixed_cpu_pct": fixed_pct, "idle_cpu_pct": idle_cpu_pct, "steps": steps}


def cpu_fit(steps):
    """Server CPU = fixed + marginal x reports/s, fitted (least squares) over the steps where
    the server kept up (>= 97 % delivered, under 90 % CPU a process): the CPU a report
    costs, and what the server spends whatever the rate (the publisher's tick, the loop)."""
    points = [(s["delivered_per_s"], s["server_cpu_pct"] / 100) for s in steps
              if s["delivered_pct"] >= 100 * DELIVERED_MIN
              and s["server_cpu_pct"] < 90 * s["processes"]]
    if len(points) < 2:
        return None, None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if not sxx:
        return None, None
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return 1e6 * slope, 100 * (my - slope * mx)


def core0_busy_s():
    """CPU time core 0 (the first server's) spent on anything but idle, in seconds."""
    t = psutil.cpu_times(percpu=True)[0]
    return sum(t) - t.idle - t.iowait


def counter(client, key):
    return int(client.get(key) or 0)


def bare_histogram(client):
    return {int(k): int(v) for k, v in client.hgetall(BARE_LATENCY_KEY).items()}


def drain(loadgen, client, key, limit_s=30):
    """Pause the load until the server stops recording (its backlog is gone)."""
    loadgen.ask("rate 0")
    deadline, last = time.monotonic() + limit_s, -1
    while time.monotonic() < deadline:
        now = counter(client, key)
        if now == last:
            break
        last = now
        time.sleep(1.0)


def start_profile(servers, kind, rate, workdir):
    out = workdir / f"profile-{kind}-{rate}.raw"
    argv = pinned(1, [shutil.which("py-spy") or str(Path(PY).parent / "py-spy"), "record",
                      "--pid", str(servers.procs[0].pid), "--duration", "8", "--rate", "200",
                      "--nonblocking", "--full-filenames", "--format", "raw",
                      "--output", str(out)])
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), out


def finish_profile(spy, workdir):
    proc, out = spy
    proc.wait(30)
    if out.exists():
        summary = out.with_suffix(".txt")
        lines = profile_summary(out, summary)
        log(f"profile: {summary}")
        print("\n".join(lines[:40]), flush=True)


def row(s):
    def ms(v):
        return "-" if v is None else f"{v:.0f}"

    cpu = "-" if s["cpu_us_per_report"] is None else f"{s['cpu_us_per_report']:.0f}"
    return (f"{s['rate']:>6} offered {s['offered_per_s']:>7.0f}/s delivered "
            f"{s['delivered_per_s']:>7.0f}/s ({s['delivered_pct']:5.1f} %) "
            f"p50 {ms(s['p50_ms']):>5} p99 {ms(s['p99_ms']):>5} max {ms(s['max_ms']):>5} ms  "
            f"cpu {cpu:>4} us/report  server {s['server_cpu_pct']:3.0f} %  "
            f"loadgen {s['loadgen_cpu_pct']:3.0f} %  publisher {s['publisher_cpu_pct']:3.0f} %  "
            f"rss {s['rss_mb']:.0f} MB  "
            f"core 0 others {s['core0_others_pct']:3.0f} %  load {s['loadavg_1m']:.2f}  "
            f"{'ok' if s['ok'] else 'FAIL'}")


def table(results):
    lines = ["| server | procs | offered/s | delivered/s | delivered | p50 ms | p99 ms | max ms "
             "| CPU us/report | server CPU | loadgen CPU | publisher CPU | RSS MB | core 0 others "
             "| load 1m | |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
             "| --- | --- |"]
    for config in results:
        for s in config["steps"]:
            lines.append(
                f"| {s['server']} | {s['processes']} | {s['rate']} | {s['delivered_per_s']:.0f}"
                f" | {s['delivered_pct']:.1f} % | {fmt(s['p50_ms'])} | {fmt(s['p99_ms'])}"
                f" | {fmt(s['max_ms'])}"
                f" | {fmt(s['cpu_us_per_report'])} | {s['server_cpu_pct']:.0f} %"
                f" | {s['loadgen_cpu_pct']:.0f} % | {s['publisher_cpu_pct']:.0f} %"
                f" | {s['rss_mb']:.0f}"
                f" | {s['core0_others_pct']:.0f} % | {s['loadavg_1m']:.2f}"
                f" | {'ok' if s['ok'] else 'fail'} |")
    lines += ["", "| server | procs | sustained reports/s | peak delivered/s "
              "| CPU per report (marginal) | fixed CPU (fitted) | connected, no samples |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for config in results:
        fixed, idle = config["fixed_cpu_pct"], config["idle_cpu_pct"]
        lines.append(f"| {config['server']} | {config['processes']} | {config['sustained']} "
                     f"| {config['peak_delivered_per_s']:.0f} | {fmt(config['marginal_cpu_us'])} us "
                     f"| {'-' if fixed is None else f'{fixed:.0f} %'} "
                     f"| {'-' if idle is None else f'{idle:.1f} %'} |")
    return "\n".join(lines)


def fmt(v):
    return "-" if v is None else f"{v:.0f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default="daphne,bare",
                        help=f"comma-separated, of {', '.join(SERVERS)} (default daphne,bare)")
    parser.add_argument("--processes", default="1", help="e.g. 1,2: server processes per config")
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--rates", default="1000,2000,3000,4000,6000,8000,10000,12000,16000,20000,24000,28000,32000",
                        type=lambda s: [int(r) for r in s.split(",")])
    parser.add_argument("--step-s", type=float, default=10.0)
    parser.add_argument("--warmup-s", type=float, default=3.0, help="at each rate, unmeasured")
    parser.add_argument("--settle-s", type=float, default=10.0,
                        help="at the first rate once the connections are open, unmeasured")
    parser.add_argument("--stop-after", type=int, default=2, help="failing steps (default 2)")
    parser.add_argument("--compression", choices=["none", "deflate"], default="none",
                        help="offer permessage-deflate as the real agent does (default none)")
    parser.add_argument("--uvicorn-args", default="",
                        help="more uvicorn options, e.g. '--loop uvloop' or '--ws websockets-sansio'")
    parser.add_argument("--profile", action="store_true",
                        help="py-spy the (first) server process 8 s in each step")
    parser.add_argument("--stalls", action="store_true",
                        help="log each server process's garbage collections, long event-loop "
                             "callbacks and RSS (stalls-*.log; bench/ingest/stalls)")
    parser.add_argument("--out", help="write the results as JSON here too")
    args = parser.parse_args()
    servers = args.servers.split(",")
    for kind in servers:
        if kind not in SERVERS:
            parser.error(f"unknown server {kind!r}")
    workdir = Path(os.environ.get("BENCH_WORKDIR") or "/tmp")
    if not pinning():
        log("WARNING: fewer than 2 cores or no taskset: nothing is pinned")

    started = time.monotonic()
    subprocess.run([PY, "manage.py", "migrate", "-v0"], cwd=REPO, check=True)
    fleet_path = workdir / "fleet.json"
    subprocess.run([PY, str(HERE / "fleet.py"), "--nodes", str(args.connections),
                    "--out", str(fleet_path)], cwd=REPO, check=True)
    fleet = json.loads(fleet_path.read_text())
    client = redis.Redis.from_url(os.environ["REDIS_URL"])

    results = []
    for kind in servers:
        for processes in [int(p) for p in args.processes.split(",")]:
            results.append(measure_config(kind, processes, args, fleet, fleet_path, client,
                                          workdir))
    print()
    print(f"ingest bench, {datetime.date.today()}, {os.cpu_count()} cores, "
          f"{args.connections} connections, {args.step_s:g} s steps, "
          f"compression {args.compression}; python {sys.version.split()[0]}; "
          f"{time.monotonic() - started:.0f} s in all")
    print(" ".join(sys.argv))
    print(table(results))
    if args.out:
        Path(args.out).write_text(json.dumps({"argv": sys.argv, "date": str(datetime.date.today()),
                                              "results": results}, indent=1))


if __name__ == "__main__":
    main()
