"""`python -m agent hook job-start` / `job-end`: Slurm's Prolog / Epilog (as root, with the
SLURM_* variables Slurm gives them).

The hook runs this node's job_start (or job_end) startup scripts from the last `config` the
running agent saved in its state dir, each with its time limit and Slurm's environment, and
leaves each script_result in the state dir's spool: the running agent sends it within a
sample interval (or, if the agent is down, once it is back). It talks to no server itself.

At job end the hook first cleans up after the job (node hygiene, agent/hygiene/job_cleanup.py):
every process of the job's user (SLURM_JOB_UID, else SLURM_JOB_USER's uid) that is the job's
(its cgroup, else /proc by SLURM_JOB_ID) is ended, never the Epilog's own processes; GPU
memory still held on the job's GPUs is looked for, and the user's older /dev/shm files go
when no process of the user carries another job's id. It asks Slurm nothing. The report goes
to the server as a `job_cleanup` notice through the same spool; GPU memory still held is
recorded for the agent, whose LeftoversWatcher sends the `job_leftovers` warning (and later
its clear). The cleanup never changes the exit status.

Exit status, as Slurm reads it: 0 when every script exited 0 (or there were none, or the
agent has saved no config yet); 1 when one failed or hit its time limit. A non-zero Prolog
drains the node (Reason "Prolog error") and requeues or fails the job; a non-zero Epilog
drains the node too. A script that must not hold up jobs should exit 0.
"""

import argparse
import logging
import os
import pwd
import sys

from agent.config import (
    DEFAULT_STATE_DIR,
    ConfigError,
    build_hygiene_config,
    read_config_file,
)
from agent.work import scripts

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
    parser.add_argument("--config", metavar="FILE",
                        help="the agent's TOML config: its node hygiene settings apply")
    return parser


def main(argv):
    parser = make_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s clusterui-agent hook: %(message)s")
    try:
        hygiene = build_hygiene_config(read_config_file(args.config) if args.config else {})
    except ConfigError as exc:
        parser.error(str(exc))
    return run_hook(EVENTS[args.event], args.state_dir, os.environ.copy(), hygiene=hygiene)


def run_hook(event, state_dir, env, *, hygiene=None, nvml=None):
    """Clean up after the job (job_end, unless hygiene is off), then run the scripts for
    `event`; the exit status for Slurm. hygiene: agent.config.HygieneConfig (None: the
    defaults); nvml: the pynvml module or a stand-in (None: pynvml, if installed)."""
    hygiene = hygiene or build_hygiene_config({})
    if event == "job_end" and hygiene.enabled is not False and env.get("SLURM_JOB_ID"):
        try:
            clean_up_after_job(state_dir, env, hygiene, nvml)
        except Exception:  # the cleanup must never fail the Epilog (it would drain the node)
            log.exception("cleaning up after job %s failed", env.get("SLURM_JOB_ID"))
    return run_scripts(event, state_dir, env)


def clean_up_after_job(state_dir, env, hygiene, nvml=None):
    """End what the job left behind; spool its job_cleanup notice, and record the GPU
    memory still held (the agent announces it as job_leftovers). The report."""
    from agent.hygiene import job_cleanup

    job_id = env["SLURM_JOB_ID"]
    job_uid, user = job_user(env)
    if job_uid is None:
        log.warning("job %s: no SLURM_JOB_UID and no user %r on this node: no process of "
                    "the job is ended", job_id, user)
    report = job_cleanup.clean_job(
        job_id=job_id, user=user, job_uid=job_uid, gpus=env.get("SLURM_JOB_GPUS"),
        nvml=nvml or pynvml_module(), grace_s=hygiene.job_cleanup_grace_s,
        cgroup_root=hygiene.slurm_cgroup_root, shm_dir=hygiene.shm_dir)
    notice = job_cleanup.cleanup_event(report)
    scripts.ResultSpool(state_dir).add(notice)
    if report["gpu_processes"]:
        job_cleanup.record_leftovers(state_dir, report)
    log.info("%s", notice["message"])
    return report


def job_user(env):
    """(uid, name) of the job's user: the uid from SLURM_JOB_UID, else from the passwd
    entry of SLURM_JOB_USER; the name from SLURM_JOB_USER, else the uid's passwd entry
    (else the uid as text). The uid is None when neither says (then "" or the unknown
    name)."""
    user = env.get("SLURM_JOB_USER") or ""
    uid = None
    try:
        uid = int(env.get("SLURM_JOB_UID", ""))
    except ValueError:
        if user:
            try:
                uid = pwd.getpwnam(user).pw_uid
            except KeyError:
                pass
    if uid is not None and not user:
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            user = str(uid)
    return uid, user


def pynvml_module():
    """The pynvml module (clean_job starts and stops NVML), or None without nvidia-ml-py."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def run_scripts(event, state_dir, env):
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
