"""Node hygiene on a real GPU (run by bench/device/h200.sh): what the fake NVML of the agent's
tests stands in for. Prints, as JSON lines:

1. nvml_gpus(): each GPU's index, UUID, minor number and device file, as gres compares
   them with Slurm's view (the fake serves minor = index: the one captured H200 read 0);
2. a "job" (a child with SLURM_JOB_ID set, holding GPU memory through torch or CuPy) as
   gpu_memory_holders() sees it: pid, GPU, used memory, job id, as NVML's compute-process
   list gives it on this driver;
3. the same after the child was ended: no holder left.

Read-only for the GPU: it allocates memory in a child and frees it by ending the child; it
changes no setting and resets nothing.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pynvml  # noqa: E402

from agent.hygiene.gres import nvml_gpus  # noqa: E402
from agent.hygiene.job_cleanup import gpu_memory_holders  # noqa: E402

JOB_ID = "424242"
HOLDER = """
import sys, time
try:
    import torch
    block = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda:0")
except ImportError:
    import cupy
    block = cupy.empty(256 * 2**20, dtype=cupy.uint8)
print("holding", flush=True)
time.sleep(120)
"""


def holders():
    pynvml.nvmlInit()
    try:
        errors = []
        found = gpu_memory_holders(pynvml, job_id=JOB_ID, job_uid=os.geteuid(), errors=errors)
        return found, errors
    finally:
        pynvml.nvmlShutdown()


def main():
    pynvml.nvmlInit()
    try:
        print(json.dumps({"nvml_gpus": nvml_gpus(pynvml)}))
    finally:
        pynvml.nvmlShutdown()
    child = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "SLURM_JOB_ID": JOB_ID})
    try:
        ready = child.stdout.readline().strip()
        found, errors = holders()
        print(json.dumps({"child": child.pid, "child_says": ready, "holders": found,
                          "errors": errors}))
    finally:
        child.kill()
        child.wait()
    time.sleep(1)
    found, errors = holders()
    print(json.dumps({"after_the_child_ended": found, "errors": errors}))


if __name__ == "__main__":
    main()
