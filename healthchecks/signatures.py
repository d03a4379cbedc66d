"""The catalog of health signatures: what each one means, where it comes from and how it
closes (DESIGN.md "Health" and "Node hygiene"; agent/README.md has the agent's side). Xids
are one entry here; their meanings come from NVIDIA's catalog (healthchecks.xid_catalog).
repairs.policy holds the default repair of each.

A *notice* records a happening, not a condition: slurmd restarted, a job's leftovers
cleaned. Each one is its own event, closed as it is recorded (healthchecks.services), so the
node's timeline shows every one; nothing stays open, and the node's state does not change.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class SignatureInfo:
    meaning: str
    source: str  # "agent", "server" or "check"
    closes: str
    notice: bool = False


AGENT, SERVER, CHECK = "agent", "server", "check"

SIGNATURES = {
    "xid:<code>": SignatureInfo(
        "an Xid error from the driver (NVIDIA's catalog: meaning, severity, action)", AGENT,
        "a reboot and passing checks, an operator, or an hour quiet for Xids the catalog "
        "does not count against the node"),
    "gpu_lost": SignatureInfo("a GPU fell off the bus, or is missing from a hello", AGENT,
                              "a reboot and passing checks, or accepting the new inventory"),
    "thermal_throttle": SignatureInfo("thermal slowdown held 10 s", AGENT, "the signal ends"),
    "power_brake": SignatureInfo("the power brake held 10 s", AGENT, "the signal ends"),
    "hw_slowdown": SignatureInfo("hardware slowdown held 10 s", AGENT, "the signal ends"),
    "ecc_dbe": SignatureInfo("volatile double-bit ECC errors rising", AGENT,
                             "an hour without a new error"),
    "row_remap_failure": SignatureInfo("a row remapping failed", AGENT, "an operator"),
    "row_remap_pending": SignatureInfo("a row remap waits for a GPU reset", AGENT,
                                       "no longer pending"),
    "gpu_recovery_action": SignatureInfo("the driver asks for a recovery action", AGENT,
                                         "back at NONE"),
    "slurm_drain": SignatureInfo("Slurm drained the node, not clusterui", AGENT,
                                 "the drain ends"),
    "nvml_error": SignatureInfo("NVML failed to read a GPU", AGENT, "an operator"),
    "slurmd_restarted": SignatureInfo("slurmd had died and the agent restarted it", AGENT,
                                      "a notice", notice=True),
    "slurmd_down": SignatureInfo(
        "slurmd is not running and the agent is not restarting it (restart off, or failing)",
        AGENT, "slurmd runs again"),
    "slurmd_flapping": SignatureInfo("slurmd was restarted 3 times in 10 minutes", AGENT,
                                     "slurmd runs a whole 10 minutes without a restart"),
    "zombie_processes": SignatureInfo("zombie processes over the agent's threshold (10)", AGENT,
                                      "below the threshold"),
    "pid_pressure": SignatureInfo("tasks over 80 % of the kernel's pid_max", AGENT,
                                  "below the threshold"),
    "job_cleanup": SignatureInfo("what a job left behind at its end, and what was cleaned",
                                 AGENT, "a notice", notice=True),
    "job_leftovers": SignatureInfo(
        "GPU memory still held after a job's cleanup: the next job would start on a dirty GPU",
        AGENT, "the processes holding it are gone"),
    "gres_drift": SignatureInfo("Slurm's view of the GPUs differs from the hardware (NVML)",
                                AGENT, "they match again (the reconfigure repair)"),
    "startup_script_failed": SignatureInfo("a startup script failed", AGENT,
                                           "the same script's next success"),
    "agent_outbox_full": SignatureInfo("the agent's full outbox dropped events", SERVER,
                                       "an operator"),
    "heartbeat_lost": SignatureInfo("the agent stopped reporting", SERVER, "it reports again"),
    "slow_gpu": SignatureInfo("a GPU much slower than its peers under the same load", SERVER,
                              "it keeps up again"),
    "check:<name>": SignatureInfo("an active check failed", CHECK, "the check passes again"),
}

NOTICES = frozenset(name for name, info in SIGNATURES.items() if info.notice)


def info_for(signature):
    """The catalog entry of a signature (xid:79 -> "xid:<code>"), or None."""
    kind, colon, _ = signature.partition(":")
    if colon:
        return SIGNATURES.get(f"{kind}:<code>" if kind == "xid" else f"{kind}:<name>")
    return SIGNATURES.get(signature)


def is_notice(signature):
    return signature in NOTICES
