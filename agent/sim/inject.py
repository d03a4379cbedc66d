"""The fault schedule of a simulated node: what each --inject fault does, and the fleet's
per-node inject file. The items' grammar is a setting's (agent.config.parse_inject):

    --inject xid:79@30s,thermal@60s+30s:gpu2,gpu_lost@90s

Each item is `<fault>@<seconds>s`, seconds after the agent started, optionally
followed by `:gpu<i>` (the GPU index; GPU 0 by default):

    xid:<code>@<s>s         one real-format NVRM Xid line in the simulated kernel log
                            (the Xid watcher makes it an `xid:<code>` event)
    xid_storm:<code>@<s>s   10,000 identical Xid lines at once (a storm: a few events
                            whose counts sum to 10,000)
    thermal@<s>s[+<d>s]     HW thermal slowdown (clock event reason 0x40, temperature
                            up) for d seconds, or until the agent stops (the throttle
                            watcher raises `thermal_throttle` once it held 10 s, and
                            clears it when it ends)
    ecc_dbe@<s>s            one more volatile double-bit ECC error on the GPU (the ECC
                            watcher raises `ecc_dbe`)
    gpu_lost@<s>s           the GPU stops answering (a gpu_lost event; it leaves the
                            samples and the next hello)

Node hygiene's faults (agent/sim/hygiene.py), on the node rather than a GPU:

    gres_drift@<s>s         Slurm's view of the node loses its last GPU (gres_drift, until
                            the server's reconfigure)
    zombies@<s>s            25 zombies under one leaking parent (zombie_processes, until
                            the server's cleanup)
    slurmd_flap@<s>s        slurmd dies three times, 20 s apart (three slurmd_restarted
                            notices, then slurmd_flapping)
    job_leftovers@<s>s      a job ends leaving a process on the GPU (job_cleanup, then
                            job_leftovers until a reboot)
"""

import os

from agent.config import check_gpu_indexes, parse_inject

XID_STORM_LINES = 10_000
INJECT_FILE = "inject"  # the fleet's: <state-dir>/<node>/inject, --inject specs one a line
# The faults of node hygiene (agent/sim/hygiene.py); the rest are the GPUs'.
HYGIENE_FAULTS = ("gres_drift", "zombies", "slurmd_flap", "job_leftovers")


def read_faults(state_dir, gpu_count):
    """The faults of the state dir's inject file (none without one)."""
    try:
        with open(os.path.join(state_dir, INJECT_FILE)) as f:
            specs = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    except FileNotFoundError:
        return []
    faults = [fault for spec in specs for fault in parse_inject(spec)]
    check_gpu_indexes(faults, gpu_count)
    return faults
