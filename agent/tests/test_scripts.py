"""Startup scripts on the node: running one with its time limit, the result spool, the Slurm
hook, and the client running boot scripts once per boot and sending every result."""

import asyncio
import json
import os
import subprocess
import sys
import time

from agent.hook import run_hook
from agent.tests.fake_server import FakeServer, until
from agent.tests.test_client import make_client, running
from agent.work import scripts


def script(id=3, event="node_boot", body="echo hello\n", timeout_s=30, version=7):
    return {"id": id, "version": version, "event": event, "role": "worker",
            "timeout_s": timeout_s, "body": body}


def test_a_script_runs_with_bash_and_its_output_is_kept():
    result = scripts.run_script(script(body="echo out; echo err >&2; exit 4\n"), job_id="12")
    assert result["type"] == "script_result" and result["script_id"] == 3
    assert (result["version"], result["event"], result["job_id"]) == (7, "node_boot", "12")
    assert result["exit_code"] == 4 and not result["timed_out"]
    assert result["output_tail"] == "out\nerr\n"


def test_only_the_last_4_kib_of_output_is_kept():
    result = scripts.run_script(script(body="head -c 10000 /dev/zero | tr '\\0' a; echo END\n"))
    assert len(result["output_tail"]) == 4096 and result["output_tail"].endswith("aEND\n")


def test_a_script_over_its_time_limit_is_killed_with_its_children(tmp_path):
    marker = tmp_path / "child-alive"
    body = f"(sleep 1.5; touch {marker}) &\necho started\nsleep 30\n"
    started = time.monotonic()
    result = scripts.run_script(script(body=body, timeout_s=0.5))
    assert time.monotonic() - started < 5
    assert result["exit_code"] is None and result["timed_out"]
    assert result["output_tail"].startswith("started\n")
    assert "killed at its time limit of 0.5 s" in result["output_tail"]
    time.sleep(1.5)
    assert not marker.exists()  # the background child died with the script's session


def test_the_spool_keeps_results_in_order_until_removed(tmp_path):
    spool = scripts.ResultSpool(str(tmp_path))
    first = spool.add({"type": "script_result", "script_id": 1})
    spool.add({"type": "script_result", "script_id": 2})
    again = scripts.ResultSpool(str(tmp_path))  # an agent restart
    assert [frame["script_id"] for _, frame in again.pending()] == [1, 2]
    again.remove(first)
    assert [frame["script_id"] for _, frame in spool.pending()] == [2]


def test_the_hook_runs_the_events_scripts_with_slurms_environment(tmp_path):
    state = str(tmp_path)
    marker = tmp_path / "marker"
    scripts.save_scripts(state, [
        script(id=1, event="job_start", body=f'echo "$SLURM_JOB_ID $SLURM_JOB_USER" > {marker}\n'),
        script(id=2, event="job_end", body="exit 9\n"),
    ])
    env = {**os.environ, "SLURM_JOB_ID": "48213", "SLURM_JOB_USER": "alice"}
    assert run_hook("job_start", state, env) == 0
    assert marker.read_text() == "48213 alice\n"
    [(_, frame)] = scripts.ResultSpool(state).pending()
    assert (frame["script_id"], frame["job_id"], frame["exit_code"]) == (1, "48213", 0)

    assert run_hook("job_end", state, env) == 1  # Slurm drains the node on this
    frames = [frame for _, frame in scripts.ResultSpool(state).pending()]
    assert [f["exit_code"] for f in frames if f["type"] == "script_result"] == [0, 9]
    # Before the job_end scripts, the job's cleanup (agent/tests/test_hook_cleanup.py).
    assert [f["signature"] for f in frames if f["type"] == "event"] == ["job_cleanup"]


def test_the_hook_without_a_saved_config_runs_nothing_and_exits_0(tmp_path):
    assert run_hook("job_start", str(tmp_path), dict(os.environ)) == 0


def test_python_m_agent_hook_is_the_command_slurm_runs(tmp_path):
    marker = tmp_path / "marker"
    scripts.save_scripts(str(tmp_path), [script(event="job_end", body=f"touch {marker}\n")])
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-m", "agent", "hook", "job-end", "--state-dir",
                           str(tmp_path)], cwd=root, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "SLURM_JOB_ID": "7"})
    assert done.returncode == 0, done.stderr
    assert marker.exists()


def test_boot_scripts_run_once_per_boot_and_every_result_reaches_the_server(tmp_path):
    marker = tmp_path / "boots"
    boot = script(id=5, body=f"echo run >> {marker}; sleep 0.3; echo booted\n")
    job = script(id=6, event="job_start", body="exit 0\n")

    async def scenario():
        async with FakeServer() as server:
            server.startup_scripts = [boot, job]
            client = make_client(server, tmp_path)
            async with running(client):
                await until(lambda: server.connections
                            and server.connections[0].of_type("script_result"))
                # The Slurm hook's result, left in the spool, goes out with the next tick.
                assert run_hook("job_start", str(tmp_path),
                                {**os.environ, "SLURM_JOB_ID": "99"}) == 0
                await until(lambda: len(server.connections[0].of_type("script_result")) == 2)
            # The agent restarts on the same boot: the boot script does not run again.
            client = make_client(server, tmp_path)
            async with running(client):
                await until(lambda: len(server.connections) == 2
                            and server.connections[1].welcomed)
                await asyncio.sleep(0.3)
            return server

    server = asyncio.run(scenario())
    boot_result, job_result = server.connections[0].of_type("script_result")
    assert boot_result["script_id"] == 5 and boot_result["exit_code"] == 0
    assert boot_result["output_tail"] == "booted\n" and boot_result["job_id"] is None
    assert (job_result["script_id"], job_result["job_id"]) == (6, "99")
    assert marker.read_text() == "run\n"
    assert server.connections[1].of_type("script_result") == []
    assert scripts.ResultSpool(str(tmp_path)).pending() == []
    assert json.loads((tmp_path / "startup_scripts.json").read_text()) == [boot, job]


def test_a_result_made_while_disconnected_is_sent_after_the_next_welcome(tmp_path):
    scripts.ResultSpool(str(tmp_path)).add({"type": "script_result", "script_id": 8,
                                            "event": "job_end", "exit_code": 0,
                                            "duration_s": 0.1})

    async def scenario():
        async with FakeServer() as server:
            async with running(make_client(server, tmp_path)):
                await until(lambda: server.connections
                            and server.connections[0].of_type("script_result"))
            return server

    server = asyncio.run(scenario())
    assert server.connections[0].of_type("script_result")[0]["script_id"] == 8


def test_a_script_gets_the_secrets_it_was_sent_and_they_are_masked_in_its_output():
    entry = {**script(body='echo "token=$REGISTRY_TOKEN"; printf %s "$REGISTRY_TOKEN" | wc -c\n'),
             "env": {"REGISTRY_TOKEN": "tok-123456", "BAD": 5}}
    result = scripts.run_script(entry)
    assert result["exit_code"] == 0
    assert "tok-123456" not in result["output_tail"]
    assert result["output_tail"] == "token=<secret REGISTRY_TOKEN>\n10\n"
