from datetime import datetime, timezone
from pathlib import Path

import pytest

from common.hostlist import expand_hostlist
from jobs.sacct import parse_elapsed, parse_sacct

FIXTURES = Path(__file__).parent / "fixtures"


def utc(*args):
    return datetime(*args, tzinfo=timezone.utc)


def by_id(name):
    jobs, warnings = parse_sacct((FIXTURES / name).read_text())
    assert warnings == []
    return {j.job_id: j for j in jobs}


def test_it_reads_every_field_of_real_sacct_output():
    jobs = by_id("sacct_finished.txt")
    assert sorted(jobs) == ["1", "2", "3", "4_0", "4_1", "5", "6", "7"]
    train = jobs["1"]
    assert (train.name, train.user, train.account, train.partition) == (
        "train|a b", "capalice", "research", "gpu")
    assert train.nodes == ("gpu-001",) and train.gpus == 2
    assert train.start == utc(2026, 11, 30, 0, 46, 17)
    assert train.end == utc(2026, 11, 30, 0, 46, 18)
    assert (train.state, train.exit_code, train.elapsed_s) == ("COMPLETED", "0:0", 1)
    assert (jobs["2"].state, jobs["2"].exit_code) == ("FAILED", "3:0")
    assert jobs["3"].nodes == ("gpu-001", "gpu-002") and jobs["3"].gpus == 8
    assert jobs["5"].state == "CANCELLED by 0" and jobs["5"].elapsed_s == 9


def test_a_running_job_has_no_end_and_a_pending_one_no_start_or_nodes():
    jobs = by_id("sacct_running.txt")
    assert jobs["5"].state == "RUNNING" and jobs["5"].end is None and jobs["5"].gpus == 8
    pending = jobs["6"]
    assert pending.start is None and pending.end is None
    assert pending.node_list == "" and pending.nodes == () and pending.gpus == 0


GOOD = "9|ok|alice|research|gpu|gpu-001|gres/gpu=1|2026-11-30T00:46:17|Unknown|RUNNING|0:0|00:00:05"


@pytest.mark.parametrize("line, why", [
    ("1|name|alice|research", "4 fields, not 12"),
    ("no separators at all", "1 fields, not 12"),
    ("|" + GOOD.partition("|")[2], "a job id of 0 characters"),
    ("9" * 65 + "|" + GOOD.partition("|")[2], "a job id of 65 characters"),
    (GOOD.replace("gpu-001", "gpu-[001-x]"), "cannot read the host list"),
    (GOOD.replace("gpu-001", "gpu-[\u0661-\u0663]"), "cannot read the host list"),
    (GOOD.replace("00:00:05", "00:0a:05"), "cannot read the elapsed time"),
])
def test_a_line_it_cannot_read_is_a_warning_and_the_rest_is_read(line, why):
    jobs, warnings = parse_sacct(f"{GOOD}\n{line}\n{GOOD.replace('9|ok', '10|ok')}\n")
    assert [job.job_id for job in jobs] == ["9", "10"]
    [warning] = warnings
    assert warning.startswith("line 2: ") and why in warning


def test_text_longer_than_its_column_is_cut_and_a_long_line_is_shown_cut():
    [job], _ = parse_sacct(GOOD.replace("|ok|", "|" + "n" * 400 + "|"))
    assert len(job.name) == 255
    _, [warning] = parse_sacct("x" * 5000)
    assert len(warning) < 400 and warning.endswith("…")


@pytest.mark.parametrize("text, names", [
    ("gpu-001", ["gpu-001"]),
    ("gpu-[001-003]", ["gpu-001", "gpu-002", "gpu-003"]),
    ("gpu-[008-010,012],login1", ["gpu-008", "gpu-009", "gpu-010", "gpu-012", "login1"]),
    ("a[1-2]b,c", ["a1b", "a2b", "c"]),
    ("", []),
])
def test_it_expands_slurm_host_lists(text, names):
    assert expand_hostlist(text) == names


@pytest.mark.parametrize("text, seconds", [
    ("00:00:09", 9), ("01:02:03", 3723), ("2-01:00:00", 2 * 86400 + 3600), ("05:02", 302),
])
def test_it_reads_elapsed(text, seconds):
    assert parse_elapsed(text) == seconds
