"""Facts about this machine that go into the hello: its name, its boot id and its Slurm
state."""

import logging
import re
import shutil
import socket
import subprocess

log = logging.getLogger(__name__)

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
SLURM_TIMEOUT_S = 5

# "NodeName=gpu-001 Arch=x86_64 ... State=IDLE+DRAIN ... Reason=disk full [root@...]":
# a key is a word followed by "=" at the start or after a space.
_SLURM_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")


def short_hostname():
    return socket.gethostname().split(".")[0]


def boot_id():
    """The kernel's boot id, which changes at every boot (Linux)."""
    with open(BOOT_ID_PATH) as f:
        return f.read().strip()


class SlurmError(Exception):
    """scontrol is missing, failed, or took too long; the message says which."""


def read_slurm_status(node_name):
    """{"state", "reason"} from `scontrol show node <name> -o`; raises SlurmError."""
    try:
        result = subprocess.run(
            ["scontrol", "show", "node", node_name, "-o"],
            capture_output=True,
            text=True,
            timeout=SLURM_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmError(f"scontrol show node {node_name} failed: {exc}") from exc
    if result.returncode != 0:
        raise SlurmError(f"scontrol show node {node_name} failed: {result.stderr.strip()}")
    fields = parse_scontrol_line(result.stdout.strip())
    return {"state": fields.get("State"), "reason": fields.get("Reason") or None}


def slurm_status(node_name):
    """The hello's `slurm`: read_slurm_status(), or None where this node runs no Slurm
    (no scontrol) or scontrol fails (logged)."""
    if shutil.which("scontrol") is None:
        return None
    try:
        return read_slurm_status(node_name)
    except SlurmError as exc:
        log.warning("%s", exc)
        return None


def _squeue(argv):
    """squeue's output lines, or None when Slurm cannot say (no squeue, slurmctld away)."""
    try:
        result = subprocess.run(["squeue", "-h", *argv], capture_output=True, text=True,
                                timeout=SLURM_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("squeue failed: %s", exc)
        return None
    if result.returncode != 0:
        log.warning("squeue failed: %s", result.stderr.strip())
        return None
    return [line.strip() for line in result.stdout.splitlines() if line.strip()]


def running_job_ids(node_name):
    """The ids (strings) of the jobs running, suspended, completing or configuring on this
    node, or None when Slurm cannot say: an orphan is a process whose SLURM_JOB_ID is none
    of them."""
    lines = _squeue(["-w", node_name, "-t", "RUNNING,SUSPENDED,COMPLETING,CONFIGURING",
                     "-o", "%A"])
    return None if lines is None else set(lines)


def parse_scontrol_line(line):
    """The key=value fields of one `scontrol show node -o` line. A value runs to the next
    key, so a Reason with spaces in it stays whole."""
    matches = list(_SLURM_KEY.finditer(line))
    fields = {}
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        fields[match.group(1)] = line[match.end() : end].strip()
    return fields
