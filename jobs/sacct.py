"""Read jobs from Slurm's accounting: run sacct for a time window and parse its parsable
output into SacctJob records.

    run_sacct(slurm_conf, since, until)   # text; ExecutorError on failure or timeout
    parse_sacct(text)                     # ([SacctJob(job_id="41", gpus=2, ...)], warnings)

A line parse_sacct cannot read is a warning ("line 7: ...: the line"), and the rest is read:
one odd job (a name sacct printed with a newline in it, a host list it cannot expand) must
not stop a cluster's accounting.
"""

from dataclasses import dataclass
from datetime import datetime, timezone

from common.hostlist import expand_hostlist
from schedulers import ExecutorError
from schedulers.slurm import gpus_from_tres, run_slurm_command

SACCT_FIELDS = ("JobID", "JobName", "User", "Account", "Partition", "NodeList", "AllocTRES",
                "Start", "End", "State", "ExitCode", "Elapsed")
SACCT_TIMEOUT_S = 60
# sacct reads and prints times in this format; TZ=UTC makes them UTC.
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"


@dataclass(frozen=True)
class SacctJob:
    job_id: str
    name: str
    user: str
    account: str
    partition: str
    node_list: str
    nodes: tuple
    gpus: int
    start: datetime | None
    end: datetime | None
    state: str
    exit_code: str
    elapsed_s: int


def run_sacct(slurm_conf, since, until, timeout_s=SACCT_TIMEOUT_S):
    """sacct's lines for every job (allocations only, -X) of every user that was pending,
    running or ended in [since, until]."""
    argv = ["sacct", "-a", "-X", "-P", "-n", f"--format={','.join(SACCT_FIELDS)}",
            "-S", since.astimezone(timezone.utc).strftime(TIME_FORMAT),
            "-E", until.astimezone(timezone.utc).strftime(TIME_FORMAT)]
    result = run_slurm_command(argv, slurm_conf=slurm_conf, timeout_s=timeout_s,
                               env={"TZ": "UTC", "SLURM_TIME_FORMAT": TIME_FORMAT})
    # Without slurmdbd sacct says so on stderr and exits 0: that is no accounting, not
    # "no jobs", and must not move the cursor.
    if "accounting storage is disabled" in result.stderr:
        raise ExecutorError(f"{' '.join(argv)}: {result.stderr.strip()[-500:]}")
    return result.stdout


# The widths of the Job columns the fields go to (jobs.models.Job): a longer job id is a
# warning, longer text is cut.
JOB_ID_MAX = 64
TEXT_MAX = {"name": 255, "user": 64, "account": 64, "partition": 64, "state": 64,
            "exit_code": 16}
WARNING_LINE_MAX = 300


def parse_sacct(text):
    """(SacctJob records, warnings) from `sacct -P -n --format=<SACCT_FIELDS>` output."""
    jobs, warnings = [], []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            jobs.append(parse_sacct_line(line))
        except ValueError as exc:
            shown = line if len(line) <= WARNING_LINE_MAX else line[:WARNING_LINE_MAX] + "…"
            warnings.append(f"line {number}: {exc}: {shown}")
    return jobs, warnings


def parse_sacct_line(line):
    # The job name may itself hold "|": the id is first, the other ten fields last.
    job_id, _, rest = line.partition("|")
    parts = rest.rsplit("|", len(SACCT_FIELDS) - 2)
    if len(parts) != len(SACCT_FIELDS) - 1:
        raise ValueError(f"{line.count('|') + 1} fields, not {len(SACCT_FIELDS)}")
    if not job_id or len(job_id) > JOB_ID_MAX:
        raise ValueError(f"a job id of {len(job_id)} characters")
    name, user, account, partition, node_list, tres, start, end, state, exit_code, elapsed = parts
    node_list = "" if node_list == "None assigned" else node_list
    text = {"name": name, "user": user, "account": account, "partition": partition,
            "state": state, "exit_code": exit_code}
    return SacctJob(
        job_id=job_id, **{field: value[:TEXT_MAX[field]] for field, value in text.items()},
        node_list=node_list, nodes=tuple(expand_hostlist(node_list)),
        gpus=gpus_from_tres(tres), start=parse_time(start), end=parse_time(end),
        elapsed_s=parse_elapsed(elapsed),
    )


def parse_time(text):
    """A sacct time (UTC, TIME_FORMAT) as an aware datetime; None for Unknown/None."""
    try:
        return datetime.strptime(text, TIME_FORMAT).replace(tzinfo=timezone.utc)
    except ValueError:
        return None


def parse_elapsed(text):
    """sacct's Elapsed ("00:00:09", "1-02:03:04") in seconds."""
    days, _, clock = text.strip().rpartition("-")
    seconds = 0
    for part in clock.split(":"):
        if not (part.isascii() and part.isdigit()):
            raise ValueError(f"cannot read the elapsed time {text!r}")
        seconds = seconds * 60 + int(part)
    if days and not (days.isascii() and days.isdigit()):
        raise ValueError(f"cannot read the elapsed time {text!r}")
    return (int(days) if days else 0) * 86400 + seconds
