from datetime import datetime, timezone
from pathlib import Path

import pytest

from jobs.sacct import expand_hostlist, parse_elapsed, parse_sacct

FIXTURES = Path(__file__).parent / "fixtures"


def utc(*args):
    return datetime(*args, tzinfo=timezone.utc)


def by_id(name):
    return {j.job_id: j for j in parse_sacct((FIXTURES / name).read_text())}


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


def test_a_line_with_missing_fields_is_an_error():
    with pytest.raises(ValueError):
        parse_sacct("1|name|alice|research\n")


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
