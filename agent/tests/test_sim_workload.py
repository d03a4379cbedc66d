"""The demo fleet's jobs (agent/sim/workload.py): the same in every process, one at a time
per node, a believable mix, and changed as Slurm would by drains, requeues and cancels; and
the simulated GPUs follow them."""

import json

from agent.sim.backend import SimulatedBackend
from agent.sim.workload import (
    GIVE_UP_S,
    REQUEUE_DELAY_S,
    START_NOW_S,
    Workload,
    lanes_of,
    new_state,
    update_state,
)

NODES = [f"gpu-{i:03d}" for i in range(1, 65)]
NOW = 1_796_300_000.0  # 2026-12-03
WEEK = 7 * 86400


def test_lanes_group_nodes_in_eights_fours_twos_then_singles():
    sizes = [len(lane) for lane in lanes_of(NODES)]
    assert sizes == [8, 8, 8, 4, 4, 4, 2, 2] + [1] * 24
    assert [len(lane) for lane in lanes_of(NODES[:5])] == [1] * 5


def test_two_processes_see_the_same_jobs():
    first = Workload(NODES).jobs_between(NOW - WEEK, NOW, NOW)
    again = Workload(list(reversed(NODES))).jobs_between(NOW - WEEK, NOW, NOW)
    assert first == again
    assert len({job.id for job in first}) == len(first)


def test_a_week_is_a_believable_mix():
    jobs = Workload(NODES).jobs_between(NOW - WEEK, NOW, NOW)
    states = {job.state for job in jobs}
    assert {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "RUNNING", "PENDING"} <= states
    assert len({job.user for job in jobs}) >= 5 and len({job.account for job in jobs}) >= 4
    assert any(len(job.nodes) == 8 for job in jobs) and any(len(job.nodes) == 1 for job in jobs)
    assert 1000 < len(jobs) < 6000
    busy = sum(1 for node in NODES if Workload(NODES).running_on(node, NOW))
    assert 0.5 * len(NODES) <= busy < len(NODES)


def test_a_node_runs_one_job_at_a_time():
    workload = Workload(NODES)
    for node in ("gpu-001", "gpu-030", "gpu-064"):
        jobs = [job for job in workload.jobs_on(node, NOW - WEEK, NOW, NOW)
                if job.start is not None]
        for before, after in zip(jobs, jobs[1:]):
            assert before.end <= after.start, (before, after)


def test_the_long_run_keeps_the_second_lane_of_eight_busy():
    workload = Workload(NODES)
    times = [NOW - WEEK + i * 3607 for i in range(160)]
    jobs = [workload.running_on("gpu-012", t) for t in times]
    assert sum(job is not None for job in jobs) >= 155
    assert {(job.name, job.nodes) for job in jobs if job} == {
        ("llama3-405b-pretrain", tuple(NODES[8:16]))}


def test_a_job_due_while_its_node_is_drained_waits_for_the_resume():
    plain = Workload(NODES)
    job = next(job for job in plain.jobs_between(NOW - 86400, NOW, NOW)
               if job.state == "COMPLETED" and len(job.nodes) == 8)
    drain = {"from": job.start - 60, "until": job.start + 600, "reason": "repair"}
    waited = Workload(NODES, drains={job.nodes[3]: [drain]}).job(job.id, NOW)
    assert waited.start == drain["until"] + START_NOW_S
    assert waited.end - waited.start == job.end - job.start

    open_drain = {**drain, "until": None}
    given_up = Workload(NODES, drains={job.nodes[3]: [open_drain]}).job(job.id, NOW)
    assert (given_up.state, given_up.start) == ("CANCELLED", None)
    assert given_up.end == job.start + GIVE_UP_S


def test_a_requeued_job_is_pending_until_its_nodes_are_back_then_runs_again():
    plain = Workload(NODES)
    job = next(job for node in NODES if (job := plain.running_on(node, NOW))
               and len(job.nodes) > 1)
    requeued_at = NOW - 30
    drain = {"from": NOW - 40, "until": None, "reason": "repair"}
    workload = Workload(NODES, drains={job.nodes[0]: [drain]},
                        jobs={job.id: {"requeued_at": requeued_at}})
    assert workload.job(job.id, NOW).state == "PENDING"
    assert workload.running_on(job.nodes[1], NOW) is None
    assert workload.node_state(job.nodes[0], NOW) == ("IDLE+DRAIN", "repair")

    resumed = {**drain, "until": NOW + 100}
    workload = Workload(NODES, drains={job.nodes[0]: [resumed]},
                        jobs={job.id: {"requeued_at": requeued_at}})
    assert workload.job(job.id, NOW + 100).state == "PENDING"  # Slurm's requeue delay
    again = workload.job(job.id, NOW + 100 + REQUEUE_DELAY_S)
    assert (again.state, again.start) == ("RUNNING", NOW + 100 + REQUEUE_DELAY_S)


def test_a_cancelled_job_ends_then():
    plain = Workload(NODES)
    job = next(job for node in NODES if (job := plain.running_on(node, NOW)))
    workload = Workload(NODES, jobs={job.id: {"cancelled_at": NOW + 10}})
    assert workload.job(job.id, NOW).state == "RUNNING"
    cancelled = workload.job(job.id, NOW + 10)
    assert (cancelled.state, cancelled.end, cancelled.exit_code) == (
        "CANCELLED", NOW + 10, "0:15")
    assert [j.id for j in workload.ended_on(job.nodes[0], NOW, NOW + 20, NOW + 20)] == [job.id]


def test_the_state_file_is_changed_whole_under_a_lock(tmp_path):
    path = tmp_path / "slurm.json"
    path.write_text(json.dumps(new_state(NODES)))
    update_state(str(path), lambda state: state["drains"].update(
        {"gpu-001": [{"from": NOW, "until": None, "reason": "r"}]}))
    saved = json.loads(path.read_text())
    assert saved["drains"]["gpu-001"][0]["reason"] == "r" and saved["nodes"] == NODES
    assert Workload.from_file(str(path)).drained("gpu-001", NOW + 1)["reason"] == "r"


def test_the_gpus_a_job_holds_are_busy_with_its_memory_and_the_others_idle():
    workload = Workload(NODES)
    node, job = next((node, job) for node in NODES
                     if (job := workload.running_on(node, NOW)) and job.gpus_per_node < 8)
    backend = SimulatedBackend(node, gpu_count=8, job=lambda: job)
    readings = backend.read_gpus()
    busy, idle = readings[:job.gpus_per_node], readings[job.gpus_per_node:]
    total = backend.gpus()[0]["memory_total_bytes"]
    assert all(r["util_pct"] >= 45 and r["power_w"] > 300 for r in busy)
    assert all(0.95 <= r["mem_used_bytes"] / (total * job.memory_fraction) <= 1 for r in busy)
    assert all(r["util_pct"] == 0 and r["mem_used_bytes"] < 2**30 for r in idle)

    idle_node = SimulatedBackend(node, gpu_count=8, job=lambda: None).read_gpus()
    assert all(r["util_pct"] == 0 and r["power_w"] < 100 for r in idle_node)


def test_gpu_activity_follows_the_job_and_stays_below_utilization():
    """The trace has no GPM readings: activity is derived from its utilization and power,
    so a job's GPUs show SM and tensor activity below their utilization, idle GPUs none."""
    workload = Workload(NODES)
    node, job = next((node, job) for node in NODES
                     if (job := workload.running_on(node, NOW)) and job.gpus_per_node < 8)
    readings = SimulatedBackend(node, gpu_count=8, job=lambda: job).read_gpus()
    busy, idle = readings[:job.gpus_per_node], readings[job.gpus_per_node:]
    for r in busy:
        assert 0 < r["tensor_active_pct"] < r["sm_active_pct"] <= r["gr_engine_active_pct"]
        assert r["gr_engine_active_pct"] <= r["util_pct"]
        assert 0 < r["sm_occupancy_pct"] < r["sm_active_pct"] and r["dram_active_pct"] > 0
    assert all(r["sm_active_pct"] == 0 and r["tensor_active_pct"] == 0 for r in idle)


def test_the_nodes_of_one_job_differ_a_little():
    workload = Workload(NODES)
    job = Workload(NODES).running_on("gpu-012", NOW)  # the long run, on eight nodes
    means = set()
    for node in job.nodes:
        readings = SimulatedBackend(node, gpu_count=8, job=lambda: job).read_gpus()
        means.add((round(sum(r["util_pct"] for r in readings) / 8),
                   sum(r["mem_used_bytes"] for r in readings) // 2**30))
    assert len(means) >= 6, means
    assert workload.running_on("gpu-009", NOW) == job
