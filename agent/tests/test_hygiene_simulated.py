"""Node hygiene on a simulated node (agent/sim/hygiene.py): injected faults become the
events the real watchers send, the server's cleanup and reconfigure end them, a reboot ends
what dies with the node, and the readings the samples carry follow."""

import asyncio

from agent.config import Config, build_config, parse_inject
from agent.connection.protocol import encode
from agent.sim.backend import SimulatedBackend
from agent.sim.hygiene import SimulatedHygiene
from agent.sim.node import simulated_hygiene
from agent.sim.workload import Workload

NODE = "gpu-020"


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def simulated(spec="", **options):
    clock = Clock()
    faults = parse_inject(spec) if spec else []
    backend = SimulatedBackend(NODE, gpu_count=8, faults=faults, clock=clock)
    hygiene = SimulatedHygiene(NODE, backend, faults, clock=clock,
                               wall=lambda: clock.now + 1.7e9, **options)
    return hygiene, backend, clock


def poll_at(hygiene, clock, t):
    clock.now = 1000.0 + t
    events = hygiene.poll([])
    for event in events:
        encode(event)  # every one is a frame the server takes
    return events


def test_a_healthy_simulated_node_reports_readings_and_no_events():
    hygiene, _, clock = simulated()
    assert poll_at(hygiene, clock, 60) == []
    assert hygiene.status_of("slurmd")["state"] == "running"
    assert hygiene.status_of("slurmd")["watched_by"] == "simulated"
    assert hygiene.status_of("processes")["zombies"] == 0
    assert hygiene.status_of("gres") == {"match": True, "nvml_gpus": 8, "slurm_gpus": 8,
                                         "checked_at": clock.now + 1.7e9, "not_compared": None}


def test_a_gpu_off_the_bus_leaves_nvml_one_short_of_slurm():
    hygiene, backend, clock = simulated("gpu_lost@10s:gpu3")
    poll_at(hygiene, clock, 20)
    assert [e["signature"] for e in backend.take_events()] == ["gpu_lost"]
    assert hygiene.status_of("gres") == {"match": False, "nvml_gpus": 7, "slurm_gpus": 8,
                                         "checked_at": clock.now + 1.7e9, "not_compared": None}


def test_gres_drift_opens_and_the_servers_reconfigure_clears_it():
    hygiene, _, clock = simulated("gres_drift@30s")
    assert poll_at(hygiene, clock, 29) == []
    [drift] = poll_at(hygiene, clock, 30)
    assert (drift["signature"], drift["severity"]) == ("gres_drift", "warning")
    assert drift["detail"]["problems"][0] == "Slurm's Gres says 7 GPUs, NVML sees 8"
    assert hygiene.status_of("gres")["match"] is False
    message = asyncio.run(hygiene.run("reconfigure", {}, None))
    assert message.endswith("Slurm's view matches NVML's 8 GPUs")
    [cleared] = poll_at(hygiene, clock, 31)
    assert (cleared["signature"], cleared["state"]) == ("gres_drift", "cleared")
    assert hygiene.status_of("gres")["match"] is True


def test_zombies_open_and_the_servers_cleanup_reaps_them():
    hygiene, _, clock = simulated("zombies@10s")
    [zombies] = poll_at(hygiene, clock, 10)
    assert zombies["signature"] == "zombie_processes" and zombies["detail"]["zombies"] == 25
    assert zombies["detail"]["processes"][0]["parent_name"] == "python3"
    assert hygiene.status_of("processes")["zombies"] == 25
    message = asyncio.run(hygiene.run("cleanup", {}, None))
    assert message == ("ended 0 orphaned processes (0 with SIGKILL); signalled 1 parent of "
                       "25 zombies; 0 zombies left")
    [cleared] = poll_at(hygiene, clock, 11)
    assert cleared["state"] == "cleared"


def test_slurmd_flapping_is_three_restarts_then_clears_after_the_window():
    hygiene, _, clock = simulated("slurmd_flap@5s", flap_window_s=120)
    signatures = []
    for t in range(0, 60):
        signatures += [e["signature"] for e in poll_at(hygiene, clock, t)]
    assert signatures == ["slurmd_restarted", "slurmd_restarted", "slurmd_restarted",
                          "slurmd_flapping"]
    assert hygiene.status_of("slurmd")["restarts"] == 3
    assert poll_at(hygiene, clock, 140) == []  # 115 s after the last restart
    [cleared] = poll_at(hygiene, clock, 166)
    assert (cleared["signature"], cleared["state"]) == ("slurmd_flapping", "cleared")


def test_job_leftovers_come_with_their_job_and_a_reboot_clears_them():
    hygiene, backend, clock = simulated("job_leftovers@20s:gpu2,zombies@30s,gres_drift@90s")
    notice, leftovers = poll_at(hygiene, clock, 20)
    assert notice["signature"] == "job_cleanup" and notice["severity"] == "info"
    assert notice["detail"]["gpu_processes"][0]["gpu_index"] == 2
    assert leftovers["signature"] == "job_leftovers" and leftovers["severity"] == "warning"
    poll_at(hygiene, clock, 30)
    backend.reboot()
    cleared = poll_at(hygiene, clock, 40)
    assert sorted((e["signature"], e["state"]) for e in cleared) == [
        ("job_leftovers", "cleared"), ("zombie_processes", "cleared")]
    assert poll_at(hygiene, clock, 100) == []  # the drift, not yet due, never comes


class FixedWorkload:
    """WorkloadFile's interface, for a workload that does not change."""

    def __init__(self, workload):
        self.workload = workload

    def current(self):
        return self.workload


def test_with_a_workload_each_job_that_ends_on_the_node_is_cleaned_up_by_its_id():
    workload = Workload([f"gpu-{i:03d}" for i in range(1, 41)], seed="hygiene")
    hygiene, _, clock = simulated(jobs=FixedWorkload(workload))
    wall_start = clock.now + 1.7e9
    notices = [e for t in range(0, 6 * 3600 + 1, 60) for e in poll_at(hygiene, clock, t)]
    ended = workload.ended_on(NODE, wall_start, clock.now + 1.7e9, clock.now + 1.7e9)
    assert ended, "six hours without a job ending on the node"
    assert [(e["detail"]["job_id"], e["detail"]["user"]) for e in notices] == [
        (job.id, job.user) for job in ended]
    assert {e["signature"] for e in notices} == {"job_cleanup"}
    assert all(e["message"].endswith("GPUs clean") for e in notices)


def test_without_a_workload_no_job_ends():
    hygiene, _, clock = simulated()
    assert [e for t in range(0, 3601, 60) for e in poll_at(hygiene, clock, t)] == []


def test_a_simulated_agent_simulates_hygiene_unless_told_otherwise(tmp_path):
    backend = SimulatedBackend(NODE, gpu_count=2)
    config = Config(node_name=NODE, simulate=True, state_dir=str(tmp_path))
    hygiene = simulated_hygiene(config, backend)
    assert set(hygiene.status()) == {"slurmd", "processes", "gres"}
    assert hygiene.commands.actions == ("cleanup", "reconfigure")
    off = build_config({"server": "ws://127.0.0.1:1/ws/agent/", "token": "t", "simulate": True,
                        "hygiene": False, "node_name": NODE})
    assert simulated_hygiene(off, backend).status() is None
