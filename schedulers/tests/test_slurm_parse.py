"""The Slurm executor's parsers against real output: `scontrol show node X -o` lines and
`squeue -O` lines saved from the Slurm 22.05 cluster of tests/slurm.py (fixtures/)."""

from pathlib import Path

import pytest

from schedulers import Job, SchedulerNode
from schedulers.slurm import (
    gpus_from_tres,
    node_from_fields,
    parse_node_line,
    parse_run_time,
    parse_squeue_jobs,
)

FIXTURES = Path(__file__).parent / "fixtures"


def node_line(name):
    return (FIXTURES / f"scontrol_show_node_{name}.txt").read_text()


@pytest.mark.parametrize("fixture, expected", [
    ("idle", SchedulerNode(state="IDLE", drained=False, reason="")),
    ("mixed", SchedulerNode(state="MIXED", drained=False, reason="")),
    ("mixed_drain", SchedulerNode(state="MIXED+DRAIN", drained=True,
                                  reason="clusterui repair #12: xid=79 on GPU 3 [auto]")),
    ("idle_drain", SchedulerNode(state="IDLE+DRAIN", drained=True,
                                 reason="clusterui repair #12: xid=79 on GPU 3 [auto]")),
    ("idle_not_responding", SchedulerNode(state="IDLE+NOT_RESPONDING", drained=False,
                                          reason="")),
    ("down", SchedulerNode(state="DOWN", drained=False, reason="Not responding")),
])
def test_it_reads_state_drain_and_reason_from_real_lines(fixture, expected):
    assert node_from_fields(parse_node_line(node_line(fixture))) == expected


def test_it_keeps_values_with_spaces_whole_and_reads_every_key():
    fields = parse_node_line(node_line("mixed_drain"))

    assert fields["NodeName"] == "gpu-001"
    assert fields["OS"].startswith("Linux ") and "SMP" in fields["OS"]
    assert fields["CfgTRES"] == "cpu=8,mem=1000M,billing=8,gres/gpu=8"
    assert fields["AllocTRES"] == "cpu=2,gres/gpu=5"
    assert fields["Gres"] == "gpu:8"
    # The "xid=79" inside the reason is not a key of its own.
    assert "xid" not in fields


def test_a_reason_without_slurms_suffix_stays_as_it_is():
    fields = parse_node_line("NodeName=n1 State=IDLE+DRAIN Reason=set by hand")

    assert fields["Reason"] == "set by hand"


def test_it_reads_running_jobs_from_real_squeue_output():
    # A 3-node job (4 GPUs on each, a 2 h time limit) and a 1-node job submitted with
    # --no-requeue and no time limit, both on gpu-003 (tests/slurm.py's cluster, accounting
    # on, as gres/gpu shows in tres-alloc only then).
    output = (FIXTURES / "squeue_running_jobs.txt").read_text()
    expanded = []

    def expand(nodelist):
        expanded.append(nodelist)
        return ["gpu-001", "gpu-002", "gpu-003"]

    assert parse_squeue_jobs(output, expand) == [
        # The name holds "|" itself, and is read whole.
        Job(id="1", user="alice", name="llama-70b pretrain|v2", gpus=12, run_time_s=2,
            account="research", nodes=("gpu-001", "gpu-002", "gpu-003"), time_left_s=7198,
            batch=True, requeueable=True),
        Job(id="2", user="bob", name="eval", gpus=2, run_time_s=2, account="infra",
            nodes=("gpu-003",), time_left_s=None, batch=True, requeueable=False),
    ]
    assert expanded == ["gpu-[001-003]"]  # only the multi-node job's list is expanded
    assert parse_squeue_jobs("") == []


@pytest.mark.parametrize("text, seconds", [
    ("0:01", 1),
    ("5:02", 302),
    ("1:05:02", 3902),
    ("2-01:05:02", 2 * 86400 + 3902),
    ("INVALID", None),
])
def test_it_reads_squeues_run_time_formats(text, seconds):
    assert parse_run_time(text) == seconds


@pytest.mark.parametrize("tres, gpus", [
    ("cpu=1,node=1,billing=1,gres/gpu=2", 2),
    ("cpu=1,node=1,billing=1", 0),
    ("", 0),
    # A typed count comes beside the total when both are tracked: not counted twice.
    ("cpu=2,gres/gpu=4,gres/gpu:h100=4", 4),
    ("cpu=2,gres/gpu:h100=4", 4),
])
def test_it_counts_gpus_in_a_tres_list(tres, gpus):
    assert gpus_from_tres(tres) == gpus
