"""Where a bench server process stops: garbage collections and long event-loop callbacks
(run.py --stalls).

run.py puts this directory first on the server's PYTHONPATH and sets BENCH_STALLS_LOG;
Python imports sitecustomize at start-up, before the server. To that file it writes:
- each collection of the oldest generation, and any collection over 10 ms, when it ends
  (timed through gc.callbacks);
- each event-loop callback (asyncio Handle._run: a task's step, a protocol's data_received,
  a timer) that ran over 20 ms, with how much of it was garbage collection, what ran, and
  where it spent the time: a thread looks at the loop thread's stack every 5 ms while a
  callback runs, and the line lists the innermost frames it saw most often;
- every 5 s, per generation: collections, their total and longest pause; the process's
  RSS; with BENCH_STALLS_OBJECTS=1 also the objects the collector tracks (gc.get_objects()
  takes a few ms itself, so off by default).
"""

import asyncio.events
import collections
import gc
import os
import sys
import threading
import time

LOG = os.environ.get("BENCH_STALLS_LOG")
COUNT_OBJECTS = os.environ.get("BENCH_STALLS_OBJECTS") == "1"
EVERY_S = 5.0
SLOW_GC_S = 0.010
SLOW_CALLBACK_S = 0.020
PAGE = os.sysconf("SC_PAGE_SIZE")
SAMPLE_EVERY_S = 0.005
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))) + "/"


def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


class Stalls:
    def __init__(self, path):
        self.out = open(path, "a", buffering=1)
        self.started = None
        self.gc_s = 0.0  # all collections' time so far
        self.callback_started = None  # perf_counter() when the running loop callback began
        self.loop_thread = None
        self.samples = collections.Counter()  # where the running callback was seen
        self.reset()
        self.next_line = time.monotonic() + EVERY_S
        self.write(f"start pid {os.getpid()} threshold {gc.get_threshold()} "
                   f"switch interval {sys.getswitchinterval()}")

    def write(self, text):
        self.out.write(f"{time.time():.3f} {text}\n")

    def reset(self):
        self.count = [0, 0, 0]
        self.total = [0.0, 0.0, 0.0]
        self.longest = [0.0, 0.0, 0.0]

    def on_gc(self, phase, info):
        if phase == "start":
            self.started = time.perf_counter()
            return
        if self.started is None:
            return
        took = time.perf_counter() - self.started
        self.gc_s += took
        gen = info["generation"]
        self.count[gen] += 1
        self.total[gen] += took
        self.longest[gen] = max(self.longest[gen], took)
        if gen == 2 or took > SLOW_GC_S:
            self.write(f"gen{gen} {1000 * took:.1f} ms collected {info['collected']} "
                       f"frozen {gc.get_freeze_count()}")
        self.maybe_report()

    def maybe_report(self):
        if time.monotonic() >= self.next_line:
            self.next_line = time.monotonic() + EVERY_S
            parts = [f"gen{g} n={self.count[g]} sum={1000 * self.total[g]:.0f}ms "
                     f"max={1000 * self.longest[g]:.1f}ms" for g in range(3)]
            line = f"every {EVERY_S:g}s: {' | '.join(parts)} | rss {rss_mb():.0f} MB"
            if COUNT_OBJECTS:
                line += f" | tracked {len(gc.get_objects())} frozen {gc.get_freeze_count()}"
            self.write(line)
            self.reset()

    def on_callback(self, callback, took, gc_s):
        # A task's step is its bound method task_wakeup/__step: name the coroutine.
        task = getattr(callback, "__self__", None)
        what = repr(task.get_coro() if hasattr(task, "get_coro") else callback)
        where = "; ".join(f"{n}x {stack}" for stack, n in self.samples.most_common(3))
        self.write(f"loop {1000 * took:.1f} ms (gc {1000 * gc_s:.1f} ms) {what[:120]} "
                   f"| seen in: {where}")

    def watch(self):
        """Thread: every 5 ms, where the loop thread is, while a callback runs long."""
        while True:
            time.sleep(SAMPLE_EVERY_S)
            started = self.callback_started
            if started is None or time.perf_counter() - started < SAMPLE_EVERY_S:
                continue
            frame = sys._current_frames().get(self.loop_thread)
            if frame is not None:
                self.samples[where(frame)] += 1


def where(frame, depth=3):
    """The innermost `depth` frames outside the standard library, as file:function:line."""
    names = []
    while frame is not None and len(names) < depth:
        path = frame.f_code.co_filename
        if "/python3." not in path or "site-packages" in path:
            short = path.rsplit("site-packages/", 1)[-1].replace(REPO, "")
            names.append(f"{short}:{frame.f_code.co_name}:{frame.f_lineno}")
        frame = frame.f_back
    return " < ".join(names)


def timed_run(original, stalls):
    def _run(self):
        callback = self._callback  # a handle cancelled while it runs forgets it
        stalls.loop_thread = threading.get_ident()
        stalls.samples.clear()
        gc_before, started = stalls.gc_s, time.perf_counter()
        stalls.callback_started = started
        original(self)
        stalls.callback_started = None
        took = time.perf_counter() - started
        if took > SLOW_CALLBACK_S:
            stalls.on_callback(callback, took, stalls.gc_s - gc_before)
        stalls.maybe_report()
    return _run


if LOG:
    _stalls = Stalls(LOG)
    gc.callbacks.append(_stalls.on_gc)
    asyncio.events.Handle._run = timed_run(asyncio.events.Handle._run, _stalls)
    threading.Thread(target=_stalls.watch, name="bench-stalls", daemon=True).start()
