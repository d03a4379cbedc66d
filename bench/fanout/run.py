"""The browser fan-out benchmark's driver (bench/README.md). Run it through bench/fanout/run.sh,
which starts the throwaway PostgreSQL and Redis and sets production mode.

One daphne process (core 0), as README.md runs it in production. The cluster's nodes report
at 1 Hz each: all but one through the ingest bench's load generator (bench/ingest/loadgen.py,
core 1), and the last one through an agent connection of this process that also sends health
events. Browser WebSockets on /ws/live/cluster/<slug>/, each with its own signed-in session of
a viewer (bench/fanout/viewers.py) and the site's Origin, run in this process too (core 1).

Per step (a number of browser sockets), over --seconds, it measures at every socket:
  summary lag  receipt time - the summary's "at" (the publisher's tick time), for every
               summary at every socket; and the summaries a socket missed
  change lag   every --change-every-s the event node sends an agent `event` (thermal_throttle,
               then its `cleared`, alternately): from the send to each socket's receipt of
               the next {"type": "health.changed"} for the cluster
and, as context: the reports the server recorded (its live store's counter), the server's
CPU, the event's ack time, this process's event-loop lag (how late its receipt times can be),
and what else used the server's core.
"""

import argparse
import asyncio
import datetime
import json
import math
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import redis

REPO = Path(__file__).resolve().parents[2]
INGEST = REPO / "bench" / "ingest"
PY = sys.executable
sys.path.insert(0, str(REPO))


# The ingest bench's driver (server start-up, load generator control, percentiles, core 0
# accounting) and load generator (its simulated agent), imported rather than copied.
from bench.ingest import loadgen  # noqa: E402
from bench.ingest import run as ingest  # noqa: E402

from websockets.asyncio.client import connect  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402

from agent.connection import protocol  # noqa: E402

log = ingest.log
percentile = ingest.percentile
SLUG = "bench"  # bench/ingest/fleet.py's cluster
OPEN_CONCURRENCY = 20
LOOP_PROBE_S = 0.01
GRACE_S = 2.0  # after a window: pushes still in flight are counted


class EventAgent(loadgen.Agent):
    """The cluster's last node: samples at 1 Hz like the others, and health events on demand.
    Notes when each event's ack comes (the server acks after the commit)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.acks = {}  # event id -> time.time() of its ack
        self.error_frames = []

    async def read(self):
        try:
            async for message in self.ws:
                now = time.time()
                frame = json.loads(message)
                if frame.get("type") == "ack":
                    for event_id in frame.get("ids", []):
                        self.acks.setdefault(event_id, now)
                elif frame.get("type") == "error":
                    self.error_frames.append(frame)
                    if len(self.error_frames) <= 3:
                        log(f"event node: {message[:200]}")
        except ConnectionClosed:
            pass

    async def samples(self):
        next_at = time.monotonic()
        while True:
            next_at += 1.0
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            if self.ws.state.name == "OPEN":
                self.send_now(self.frame(time.monotonic()))

    async def send_event(self, cleared):
        gpu_uuid = self.backend.gpus()[0]["uuid"]
        frame = protocol.event_frame(
            signature="thermal_throttle", severity="warning",
            message="bench/fanout: thermal throttle", gpu_uuid=gpu_uuid,
            detail={"source": "bench"}, state="cleared" if cleared else "active")
        sent_at = time.time()
        frame["ts"] = sent_at
        await self.ws.send(protocol.encode(frame))
        return frame["id"], sent_at


class Browser:
    """One browser tab on the cluster's live page: listens, and notes when each message came."""

    def __init__(self, url, origin, cookie):
        self.url, self.origin, self.cookie = url, origin, cookie
        self.ws = None
        self.summaries = []  # (at, received)
        self.changes = []  # received, of {"type": "health.changed", "cluster": SLUG}
        self.others = Counter()
        self.closed = None

    async def open(self):
        self.ws = await connect(self.url, origin=self.origin,
                                additional_headers={"Cookie": self.cookie},
                                ping_interval=None,  # the server pings; answers are automatic
                                max_size=2**20, open_timeout=120, close_timeout=2)
        asyncio.get_running_loop().create_task(self.read())

    async def read(self):
        try:
            async for message in self.ws:
                now = time.time()
                data = json.loads(message)
                kind = data.get("type")
                if kind == "health.changed" and data.get("cluster") == SLUG:
                    self.changes.append(now)
                elif kind is None and "at" in data and data.get("cluster") == SLUG:
                    self.summaries.append((data["at"], now))
                else:
                    self.others[kind or "?"] += 1
        except ConnectionClosed as exc:
            self.closed = exc.rcvd.code if exc.rcvd else None
        except Exception as exc:  # noqa: BLE001 - counted, reported
            self.closed = repr(exc)


class LoopLag:
    """How late this process's event loop wakes (every LOOP_PROBE_S): a receipt time here is
    late by up to that much."""

    def __init__(self):
        self.samples = []  # (time, lateness_s)

    async def run(self):
        while True:
            before = time.monotonic()
            await asyncio.sleep(LOOP_PROBE_S)
            self.samples.append((time.time(), time.monotonic() - before - LOOP_PROBE_S))

    def between(self, start, end):
        return sorted(late for at, late in self.samples if start <= at < end)


async def ask(loadgen_proc, command):
    return await asyncio.to_thread(loadgen_proc.ask, command)


async def open_browsers(browsers, count, url, origin, cookie_name, keys):
    limit = asyncio.Semaphore(OPEN_CONCURRENCY)

    async def one(key):
        async with limit:
            browser = Browser(url, origin, f"{cookie_name}={key}")
            await browser.open()
            return browser

    started = time.monotonic()
    new = await asyncio.gather(*(one(key) for key in keys[len(browsers):count]))
    browsers.extend(new)
    return time.monotonic() - started


async def send_changes(agent, every_s, sends, state):
    """Every every_s: thermal_throttle, then its cleared, alternately (state["active"] carries
    on across steps)."""
    next_at = time.monotonic()
    while True:
        cleared = state["active"]
        event_id, sent_at = await agent.send_event(cleared)
        state["active"] = not cleared
        sends.append({"id": event_id, "sent": sent_at, "cleared": cleared})
        next_at += every_s
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))


def summary_figures(browsers, t0, t1):
    lags, per_socket, gaps = [], [], []
    ticks = set()
    for b in browsers:
        got = [(at, rcvd) for at, rcvd in b.summaries if t0 <= at < t1]
        per_socket.append(len(got))
        ticks.update(at for at, _ in got)
        lags.extend(rcvd - at for at, rcvd in got)
        received = sorted(rcvd for _, rcvd in got)
        gaps.extend(later - earlier for earlier, later in zip(received, received[1:]))
    lags.sort()
    gaps.sort()
    seconds = math.floor(t1 - t0)
    n_ticks = len(ticks)
    # Fan-out spread: per tick, from its first socket's receipt to its last one's.
    by_tick = {}
    for b in browsers:
        for at, rcvd in b.summaries:
            if t0 <= at < t1:
                first, last = by_tick.get(at, (rcvd, rcvd))
                by_tick[at] = (min(first, rcvd), max(last, rcvd))
    spreads = sorted(last - first for first, last in by_tick.values())
    firsts = sorted(first - at for at, (first, _) in by_tick.items())
    return {
        "n": len(lags), "p50_ms": ms(percentile(lags, 50)), "p95_ms": ms(percentile(lags, 95)),
        "p99_ms": ms(percentile(lags, 99)), "max_ms": ms(lags[-1] if lags else None),
        "seconds": seconds, "ticks": n_ticks,
        "missed_vs_ticks": sum(max(0, n_ticks - got) for got in per_socket),
        "sockets_short_of_ticks": sum(1 for got in per_socket if got < n_ticks),
        "sockets_short_of_seconds": sum(1 for got in per_socket if got < seconds),
        "missed_vs_seconds": sum(max(0, seconds - got) for got in per_socket),
        "per_socket_min": min(per_socket, default=0), "per_socket_max": max(per_socket, default=0),
        "gap_p95_ms": ms(percentile(gaps, 95)), "gap_max_ms": ms(gaps[-1] if gaps else None),
        "first_p50_ms": ms(percentile(firsts, 50)), "first_p95_ms": ms(percentile(firsts, 95)),
        "first_max_ms": ms(firsts[-1] if firsts else None),
        "spread_p50_ms": ms(percentile(spreads, 50)), "spread_p95_ms": ms(percentile(spreads, 95)),
        "spread_max_ms": ms(spreads[-1] if spreads else None),
    }


def change_figures(browsers, sends, acks, t1):
    """Each send's window runs to the next send (the last one's to t1 + GRACE_S): a socket's
    first health.changed in it is its lag; none is a miss; more are counted as extra."""
    lags, ack_lags = [], []
    missed = extra = 0
    for i, send in enumerate(sends):
        start = send["sent"]
        end = sends[i + 1]["sent"] if i + 1 < len(sends) else t1 + GRACE_S
        for b in browsers:
            got = [rcvd for rcvd in b.changes if start <= rcvd < end]
            if got:
                lags.append(got[0] - start)
                extra += len(got) - 1
            else:
                missed += 1
        if send["id"] in acks:
            ack_lags.append(acks[send["id"]] - start)
    lags.sort()
    ack_lags.sort()
    return {
        "sends": len(sends), "n": len(lags), "expected": len(sends) * len(browsers),
        "missed": missed, "extra": extra,
        "p50_ms": ms(percentile(lags, 50)), "p95_ms": ms(percentile(lags, 95)),
        "p99_ms": ms(percentile(lags, 99)), "max_ms": ms(lags[-1] if lags else None),
        "acked": len(ack_lags), "ack_p50_ms": ms(percentile(ack_lags, 50)),
        "ack_max_ms": ms(ack_lags[-1] if ack_lags else None),
    }


def ms(seconds):
    return None if seconds is None else round(1000 * seconds, 1)


def cpu_s(proc):
    t = proc.cpu_times()
    return t.user + t.system


async def measure_step(count, args, ctx):
    browsers, agent, lg, servers, client = (ctx["browsers"], ctx["agent"], ctx["loadgen"],
                                            ctx["servers"], ctx["redis"])
    opened_s = await open_browsers(browsers, count, ctx["url"], ctx["origin"],
                                   ctx["cookie_name"], ctx["keys"])
    log(f"{count} sockets: {count - ctx['open_before']} opened in {opened_s:.1f} s; "
        f"settling {args.settle_s:g} s")
    ctx["open_before"] = count
    await asyncio.sleep(args.settle_s)
    active = [b for b in browsers if b.closed is None]
    if len(active) < count:
        log(f"WARNING: {count - len(active)} sockets closed before the window")

    me = psutil.Process()
    a_lg = await ask(lg, "stats")
    a = {"server": servers.cpu_s(), "me": cpu_s(me), "recorded": ingest.counter(
        client, ingest.RECORDED_KEY), "core0": ingest.core0_busy_s() - servers.cpu_s(True)}
    t0 = time.time()
    sends = []
    sender = asyncio.get_running_loop().create_task(
        send_changes(agent, args.change_every_s, sends, ctx["change_state"]))
    await asyncio.sleep(args.seconds)
    t1 = time.time()
    sender.cancel()
    b_lg = await ask(lg, "stats")
    b = {"server": servers.cpu_s(), "me": cpu_s(me), "recorded": ingest.counter(
        client, ingest.RECORDED_KEY), "core0": ingest.core0_busy_s() - servers.cpu_s(True)}
    await asyncio.sleep(GRACE_S)  # pushes of the last change still on their way
    window = t1 - t0
    loop_lag = ctx["loop_lag"].between(t0, t1)
    offered = sum(b_lg[k] - a_lg[k] for k in ("sent", "skipped", "lost")) + window  # + event node
    delivered = b["recorded"] - a["recorded"]
    sends = [s for s in sends if s["sent"] < t1]
    result = {
        "sockets": count, "sockets_open": sum(1 for b_ in browsers if b_.closed is None),
        "window_s": round(window, 1),
        "summary": summary_figures(browsers[:count], t0, t1),
        "change": change_figures(browsers[:count], sends, agent.acks, t1),
        "reports_offered_per_s": round(offered / window), "reports_recorded_per_s":
            round(delivered / window), "recorded_pct": round(100 * delivered / offered, 1),
        "skipped": b_lg["skipped"] - a_lg["skipped"], "lost": b_lg["lost"] - a_lg["lost"],
        "server_cpu_pct": round(100 * (b["server"] - a["server"]) / window),
        "server_rss_mb": round(servers.rss_mb()),
        "browsers_cpu_pct": round(100 * (b["me"] - a["me"]) / window),
        "loadgen_cpu_pct": round(100 * (b_lg["cpu_s"] - a_lg["cpu_s"]) / window),
        "core0_others_pct": round(100 * (b["core0"] - a["core0"]) / window),
        "client_loop_lag_p99_ms": ms(percentile(loop_lag, 99)),
        "client_loop_lag_max_ms": ms(loop_lag[-1] if loop_lag else None),
        "other_messages": dict(sum((b_.others for b_ in browsers[:count]), Counter())),
        "event_errors": len(agent.error_frames),
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }
    log(step_lines(result))
    dump(browsers[:count], sends, t0, t1, ctx["workdir"] / f"lags-{count}.csv")
    return result


def dump(browsers, sends, t0, t1, path):
    """Every observation of the step, for a look later: summaries (socket, at, received) and
    the changes' sends and receipts (socket -1 is the send)."""
    rows = ["kind,socket,at,received"]
    for i, b in enumerate(browsers):
        rows += [f"summary,{i},{at:.6f},{rcvd:.6f}" for at, rcvd in b.summaries if t0 <= at < t1]
    rows += [f"change,-1,{s['sent']:.6f}," for s in sends]
    for i, b in enumerate(browsers):
        rows += [f"change,{i},,{rcvd:.6f}" for rcvd in b.changes if t0 <= rcvd < t1 + GRACE_S]
    path.write_text("\n".join(rows) + "\n")


def step_lines(r):
    s, c = r["summary"], r["change"]
    return "\n".join([
        f"{r['sockets']} sockets, {r['window_s']} s, {r['reports_recorded_per_s']} reports/s "
        f"recorded ({r['recorded_pct']} % of {r['reports_offered_per_s']}/s offered)",
        f"  summary lag  p50 {s['p50_ms']} p95 {s['p95_ms']} p99 {s['p99_ms']} max {s['max_ms']} "
        f"ms over {s['n']} summaries ({s['ticks']} ticks in {s['seconds']} s; per socket "
        f"{s['per_socket_min']}-{s['per_socket_max']}; missed {s['missed_vs_ticks']} "
        f"[{s['sockets_short_of_ticks']} sockets short of the ticks, "
        f"{s['sockets_short_of_seconds']} of the seconds]; gap between summaries p95 "
        f"{s['gap_p95_ms']} max {s['gap_max_ms']} ms)",
        f"  summary: at -> a tick's first socket p50 {s['first_p50_ms']} p95 {s['first_p95_ms']} "
        f"max {s['first_max_ms']} ms; first -> last socket p50 {s['spread_p50_ms']} "
        f"p95 {s['spread_p95_ms']} max {s['spread_max_ms']} ms",
        f"  change lag   p50 {c['p50_ms']} p95 {c['p95_ms']} p99 {c['p99_ms']} max {c['max_ms']} "
        f"ms over {c['n']} of {c['expected']} pushes ({c['sends']} events; missed "
        f"{c['missed']}, extra {c['extra']}; ack p50 {c['ack_p50_ms']} max {c['ack_max_ms']} "
        f"ms, {c['acked']} acked)",
        f"  server CPU {r['server_cpu_pct']} %, RSS {r['server_rss_mb']} MB; browsers "
        f"{r['browsers_cpu_pct']} % (loop lag p99 {r['client_loop_lag_p99_ms']} max "
        f"{r['client_loop_lag_max_ms']} ms); loadgen {r['loadgen_cpu_pct']} %; core 0 others "
        f"{r['core0_others_pct']} %; load {r['loadavg_1m']}; other messages "
        f"{r['other_messages'] or 'none'}; sockets open {r['sockets_open']}",
    ])


def table(steps, target_ms):
    lines = ["| sockets | reports/s recorded | summary lag p50 / p95 / max ms | summaries | "
             "missed | change lag p50 / p95 / max ms | pushes | missed | server CPU | "
             "core 0 others | load 1m |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in steps:
        s, c = r["summary"], r["change"]
        lines.append(
            f"| {r['sockets']} | {r['reports_recorded_per_s']} ({r['recorded_pct']} %) | "
            f"{s['p50_ms']} / {s['p95_ms']} / {s['max_ms']} | {s['n']} | {s['missed_vs_ticks']} | "
            f"{c['p50_ms']} / {c['p95_ms']} / {c['max_ms']} | {c['n']} of {c['expected']} | "
            f"{c['missed']} | {r['server_cpu_pct']} % | {r['core0_others_pct']} % | "
            f"{r['loadavg_1m']} |")
    for r in steps:
        verdicts = []
        for name in ("summary", "change"):
            p95 = r[name]["p95_ms"]
            ok = p95 is not None and p95 < target_ms
            verdicts.append(f"{name} p95 {p95} ms {'<' if ok else '>='} {target_ms:g} ms: "
                            f"{'met' if ok else 'NOT MET'}")
        lines.append(f"{r['sockets']} sockets: " + "; ".join(verdicts))
    return "\n".join(lines)


async def run(args, fleet, viewers, servers, lg, client, workdir):
    port = servers.ports[0]
    node = fleet["nodes"][-1]
    node_metrics = loadgen.NodeMetrics()
    await asyncio.sleep(0.2)
    node_metrics = node_metrics.read()  # one real reading, as the load generator's
    agent = EventAgent(node["node"], node["token"], f"ws://127.0.0.1:{port}/ws/agent/",
                       node_metrics)
    await agent.start(None)
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(agent.samples())]
    loop_lag = LoopLag()
    tasks.append(loop.create_task(loop_lag.run()))
    ctx = {"browsers": [], "agent": agent, "loadgen": lg, "servers": servers, "redis": client,
           "url": f"ws://127.0.0.1:{port}/ws/live/cluster/{SLUG}/",
           "origin": f"http://127.0.0.1:{port}", "cookie_name": viewers["cookie_name"],
           "keys": viewers["session_keys"], "open_before": 0, "loop_lag": loop_lag,
           "change_state": {"active": False}, "workdir": workdir}
    steps = []
    try:
        for count in args.sockets:
            steps.append(await measure_step(count, args, ctx))
            if not servers.alive():
                log("the server exited; see its log")
                break
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*(b.ws.close() for b in ctx["browsers"]), agent.ws.close(),
                             return_exceptions=True)
    return steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000,
                        help="nodes reporting at 1 Hz each (default 2000: 2,000 reports/s)")
    parser.add_argument("--sockets", default="200", type=lambda s: [int(n) for n in s.split(",")],
                        help="browser sockets, one step each, e.g. 50,100,200 (default 200)")
    parser.add_argument("--seconds", type=float, default=90.0,
                        help="measured seconds per step (default 90)")
    parser.add_argument("--settle-s", type=float, default=15.0,
                        help="after the sockets of a step opened, unmeasured (default 15)")
    parser.add_argument("--change-every-s", type=float, default=2.0,
                        help="one health event every this many seconds (default 2)")
    parser.add_argument("--target-ms", type=float, default=500.0, help="p95 target (500)")
    parser.add_argument("--out", help="write the results as JSON here too")
    args = parser.parse_args()
    if args.sockets != sorted(args.sockets) or args.sockets[0] < 1:
        parser.error("--sockets: increasing counts, e.g. 50,100,200")
    if args.nodes < 2:
        parser.error("--nodes: at least 2")
    workdir = Path(os.environ.get("BENCH_WORKDIR") or "/tmp")
    # Everything after the set-up must end by then, whatever happens.
    limit_s = 900 + len(args.sockets) * (args.seconds + args.settle_s + GRACE_S + 60)

    started = time.monotonic()
    subprocess.run([PY, "manage.py", "migrate", "-v0"], cwd=REPO, check=True, timeout=600)
    fleet_path, viewers_path = workdir / "fleet.json", workdir / "viewers.json"
    subprocess.run([PY, str(INGEST / "fleet.py"), "--nodes", str(args.nodes),
                    "--out", str(fleet_path)], cwd=REPO, check=True, timeout=600)
    subprocess.run([PY, str(Path(__file__).parent / "viewers.py"), "--sessions",
                    str(max(args.sockets)), "--out", str(viewers_path)],
                   cwd=REPO, check=True, timeout=600)
    fleet = json.loads(fleet_path.read_text())
    viewers = json.loads(viewers_path.read_text())
    client = redis.Redis.from_url(os.environ["REDIS_URL"])

    servers = ingest.Servers("daphne", 1, argparse.Namespace(stalls=False, uvicorn_args=""),
                             workdir)
    lg = None
    try:
        # Every node but the last through the load generator, at 1 Hz each.
        lg = ingest.LoadGenProcess(fleet_path, servers.ports, args.nodes - 1, "none")
        ready = lg.read()
        log(f"load generator: {ready['ready']} connections open in {ready['setup_s']} s, "
            f"frames of {ready['frame_bytes']} bytes; {args.nodes - 1} reports/s from it, "
            f"1/s from the event node")
        lg.ask(f"rate {args.nodes - 1}")
        steps = asyncio.run(asyncio.wait_for(
            run(args, fleet, viewers, servers, lg, client, workdir), limit_s))
    finally:
        if lg is not None:
            lg.stop()
        servers.stop()

    print()
    print(f"fan-out bench, {datetime.date.today()}, {os.cpu_count()} cores, daphne x1, "
          f"{args.nodes} nodes at 1 Hz, {args.seconds:g} s a step, a change every "
          f"{args.change_every_s:g} s; python {sys.version.split()[0]}; "
          f"{time.monotonic() - started:.0f} s in all")
    print(" ".join(sys.argv))
    for r in steps:
        print(step_lines(r))
    print(table(steps, args.target_ms))
    if args.out:
        Path(args.out).write_text(json.dumps({"argv": sys.argv, "date": str(datetime.date.today()),
                                              "steps": steps}, indent=1))
    (workdir / "results.json").write_text(json.dumps({"argv": sys.argv, "steps": steps},
                                                     indent=1))


if __name__ == "__main__":
    main()
