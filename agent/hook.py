"""`python -m agent hook job-start` / `job-end`: Slurm's Prolog / Epilog (as root, with the
SLURM_* variables Slurm gives them).

The hook runs this node's job_start (or job_end) startup scripts from the last `config` the
running agent saved in its state dir, each with its time limit and Slurm's environment, and
leaves each script_result in the state dir's spool: the running agent sends it within a
sample interval (or, if the agent is down, once it is back). It talks to no server itself.

Exit status, as Slurm reads it: 0 when every script exited 0 (or there were none, or the
agent has saved no config yet); 1 when one failed or hit its time limit. A non-zero Prolog
drains the node (Reason "Prolog error") and requeues or fails the job; a non-zero Epilog
drains the node too. A script that must not hold up jobs should exit 0.
"""

import argparse
import logging
import os
import sys

from agent import scripts
from agent.config import DEFAULT_STATE_DIR

log = logging.getLogger("agent.hook")

EVENTS = {"job-start": "job_start", "job-end": "job_end"}


def make_parser():
    parser = argparse.ArgumentParser(
        prog="python -m agent hook",
        description="Run this node's job startup scripts from Slurm's Prolog (job-start) or "
                    "Epilog (job-end).")
    parser.add_argument("event", choices=sorted(EVENTS))
    parser.add_argument("--state-dir", default=os.environ.get("CLUSTERUI_AGENT_STATE_DIR",
                                                               DEFAULT_STATE_DIR),
                        help=f"the agent's state dir (default {DEFAULT_STATE_DIR}, or "
                             f"$CLUSTERUI_AGENT_STATE_DIR)")
    return parser


def main(argv):
    args = make_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s clusterui-agent hook: %(message)s")
    return run_hook(EVENTS[args.event], args.state_dir, os.environ.copy())


def run_hook(event, state_dir, env):
    """Run the scripts for `event`; the exit status for Slurm."""
    try:
        saved = scripts.load_scripts(state_dir)
    except (OSError, ValueError) as exc:
        log.error("cannot read the startup scripts in %s: %s", state_dir, exc)
        return 1
    if saved is None:
        log.warning("no startup scripts saved in %s yet (has the agent connected?): none run",
                    state_dir)
        return 0
    chosen = [script for script in saved if script["event"] == event]
    if not chosen:
        return 0
    job_id = env.get("SLURM_JOB_ID") or None
    spool = scripts.ResultSpool(state_dir)
    status = 0
    for script in chosen:
        result = scripts.run_script(script, job_id=job_id, env=env)
        spool.add(result)
        if not scripts.succeeded(result):
            status = 1
            how = "timed out" if result["timed_out"] else f"exited with {result['exit_code']}"
            log.error("%s script %s (job %s) %s: %s", event, script["id"], job_id, how,
                      result["output_tail"][-500:].strip())
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
