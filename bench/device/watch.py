"""The agent's passive detectors against the real GPUs for N seconds, printing every event
and a per-second line of the readings they judge; optionally a bf16 matmul load on GPU 0
from --load-from for --load-for seconds (a child process, torch), to see that the normal
SW-power-cap bit under load raises nothing.

    python3 bench/device/watch.py --seconds 40 --load-from 10 --load-for 20
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agent.backends.nvml import NvmlBackend  # noqa: E402
from agent.config import build_config  # noqa: E402
from agent.detectors import close_watchers, make_watchers  # noqa: E402

LOAD = """
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + {seconds}
while time.time() < end:
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40)
    parser.add_argument("--load-from", type=float, default=None)
    parser.add_argument("--load-for", type=float, default=20)
    args = parser.parse_args()

    config = build_config({"server": "ws://unused/", "node_name": "device"})
    backend = NvmlBackend()
    watchers = make_watchers(config, backend)
    print(f"watchers: {[type(w).__name__ for w in watchers]}", flush=True)
    load = None
    started = time.monotonic()
    events = 0
    try:
        while (elapsed := time.monotonic() - started) < args.seconds:
            if args.load_from is not None and load is None and elapsed >= args.load_from:
                load = subprocess.Popen([sys.executable, "-c", LOAD.format(seconds=args.load_for)])
            readings = backend.read_gpus()
            found = backend.take_events()
            for watcher in watchers:
                found.extend(watcher.poll(readings))
            for event in found:
                events += 1
                print("EVENT " + json.dumps(event), flush=True)
            summary = [(r["util_pct"], r["sm_clock_mhz"], r["clock_event_reasons"], r["temp_c"],
                        r["power_w"]) for r in readings]
            print(f"{elapsed:5.1f}s util,sm_mhz,reasons,temp,W per GPU: {summary}", flush=True)
            time.sleep(1.0)
    finally:
        if load is not None:
            load.wait(timeout=60)
        close_watchers(watchers)
        backend.close()
    print(f"{events} events in {args.seconds:g} s")


if __name__ == "__main__":
    main()
