"""SlurmdWatcher against a fake `slurmd` and a fake `systemctl` on PATH.

The fake slurmd is a Python script named slurmd, so its process's comm is "slurmd" as
a real one's is. `slurmd -N <node>` daemonizes as the real one does (fork, setsid, fork,
stdio on /dev/null) and writes run/slurmd-<node>.pid; flag files in its folder make it
fail as slurmd does when its port is taken, exit 0 without starting, or ignore SIGTERM;
it records the names of its environment's variables. The fake systemctl answers
`systemctl show <unit> -p ...` in systemd's own order (the Service properties, then the
Unit ones, whatever order -p asks for) from a JSON state the test sets, and
`systemctl restart <unit>` as systemd does for a unit that runs it: stop, start,
NRestarts back to 0, or the "Job for ... failed" error (Result=exit-code)."""

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from agent.hygiene import slurmd as slurmd_module
from agent.hygiene.slurmd import SlurmdWatcher, format_duration, live_slurmd_started_at

FAKE_SLURMD = """#!{python}
import os, signal, sys, time
FOLDER = {folder!r}
def flag(name):
    return os.path.exists(os.path.join(FOLDER, name))
with open(os.path.join(FOLDER, "slurmd_calls"), "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
with open(os.path.join(FOLDER, "slurmd_environ"), "w") as f:
    f.write("\\n".join(sorted(os.environ)))
if flag("fail"):
    print("slurmd: error: Unable to bind listen port (6818): Address already in use")
    sys.exit(1)
if flag("start_nothing"):
    sys.exit(0)
node = sys.argv[sys.argv.index("-N") + 1] if "-N" in sys.argv else "fake"
if "-D" not in sys.argv:
    if os.fork():
        sys.exit(0)
    os.setsid()
    if os.fork():
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
if flag("ignore_term"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
path = os.path.join(FOLDER, "run", "slurmd-" + node + ".pid")
with open(path + ".new", "w") as f:
    f.write(str(os.getpid()) + "\\n")
os.replace(path + ".new", path)
with open(os.path.join(FOLDER, "pids"), "a") as f:
    f.write(str(os.getpid()) + "\\n")
time.sleep(3600)
"""

FAKE_SYSTEMCTL = """#!{python}
import json, os, signal, subprocess, sys, time
FOLDER = {folder!r}
STATE = os.path.join(FOLDER, "unit.json")
# systemd prints the Service interface's properties, then the Unit's.
ORDER = ("Result", "MainPID", "NRestarts", "ExecMainStartTimestampMonotonic", "LoadState",
         "ActiveState", "SubState")
with open(os.path.join(FOLDER, "systemctl_calls"), "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
with open(STATE) as f:
    state = json.load(f)
command, unit = sys.argv[1], sys.argv[2]
if command == "show":
    wanted = sys.argv[sys.argv.index("-p") + 1].split(",")
    for key in ORDER:
        if key in wanted:
            print(key + "=" + str(state[key]))
    sys.exit(0)
assert command == "restart", command
if state["MainPID"]:
    try:
        os.kill(state["MainPID"], signal.SIGKILL)
    except ProcessLookupError:
        pass
if os.path.exists(os.path.join(FOLDER, "refuse")):
    state.update(MainPID=0, ActiveState="failed", SubState="failed", Result="exit-code")
    with open(STATE, "w") as f:
        json.dump(state, f)
    print("Job for " + unit + ".service failed because the control process exited with "
          "error code.", file=sys.stderr)
    print('See "systemctl status ' + unit + '.service" and "journalctl -xeu ' + unit +
          '.service" for details.', file=sys.stderr)
    sys.exit(1)
pid_file = os.path.join(FOLDER, "run", "slurmd-" + unit + ".pid")
old = open(pid_file).read() if os.path.exists(pid_file) else ""
subprocess.run(["slurmd", "-N", unit], check=True)
while not os.path.exists(pid_file) or open(pid_file).read() in (old, ""):
    time.sleep(0.02)
state.update(MainPID=int(open(pid_file).read()), ActiveState="active", SubState="running",
             Result="success", NRestarts=0,
             ExecMainStartTimestampMonotonic=int(time.monotonic() * 1e6))
with open(STATE, "w") as f:
    json.dump(state, f)
"""


class FakeNode:
    """The fake programs in a folder put first on PATH, and what they were asked."""

    def __init__(self, folder):
        self.folder = folder
        (folder / "run").mkdir()
        for name, text in (("slurmd", FAKE_SLURMD), ("systemctl", FAKE_SYSTEMCTL)):
            path = folder / name
            path.write_text(text.format(python=sys.executable, folder=str(folder)))
            path.chmod(0o755)

    def pid_file(self, node="gpu-001"):
        return self.folder / "run" / f"slurmd-{node}.pid"

    def pid(self, node="gpu-001"):
        path = self.pid_file(node)
        return int(path.read_text()) if path.exists() else None

    def start_slurmd(self, node="gpu-001"):
        """`slurmd -N <node>` as an operator would; its pid once it wrote its pid file."""
        old = self.pid(node)
        subprocess.run([str(self.folder / "slurmd"), "-N", node], check=True)
        deadline = time.monotonic() + 10
        while self.pid(node) in (None, old):
            assert time.monotonic() < deadline, "the fake slurmd wrote no pid file"
            time.sleep(0.02)
        return self.pid(node)

    def kill(self, pid, sig=signal.SIGKILL):
        os.kill(pid, sig)
        deadline = time.monotonic() + 5
        while live_slurmd_started_at(pid) is not None:
            assert time.monotonic() < deadline
            time.sleep(0.02)

    def flag(self, name, on=True):
        path = self.folder / name
        if on:
            path.write_text("")
        else:
            path.unlink(missing_ok=True)

    def calls(self, program):
        path = self.folder / f"{program}_calls"
        return path.read_text().splitlines() if path.exists() else []

    def all_pids(self):
        path = self.folder / "pids"
        return [int(p) for p in path.read_text().split()] if path.exists() else []


class FakeSystemd:
    """The unit's state as the fake systemctl reads it, and what systemd itself does."""

    def __init__(self, node):
        self.node = node
        self.path = node.folder / "unit.json"
        # A unit never started: inactive, Result=success (as after `systemctl stop`).
        self.write(LoadState="loaded", ActiveState="inactive", SubState="dead",
                   Result="success", MainPID=0, NRestarts=0,
                   ExecMainStartTimestampMonotonic=0)

    def state(self):
        return json.loads(self.path.read_text())

    def write(self, **changes):
        state = self.state() if self.path.exists() else {}
        state.update(changes)
        self.path.write_text(json.dumps(state))

    def run_slurmd(self, restarts=None):
        """systemd started slurmd (the unit is named slurmd: the fake's node is "slurmd")."""
        pid = self.node.start_slurmd("slurmd")
        self.write(MainPID=pid, ActiveState="active", SubState="running",
                   ExecMainStartTimestampMonotonic=int(time.monotonic() * 1e6),
                   **({} if restarts is None else {"NRestarts": restarts}))
        return pid

    def restart_by_itself(self):
        """slurmd died and systemd's Restart= started it again."""
        self.node.kill(self.state()["MainPID"])
        return self.run_slurmd(restarts=self.state()["NRestarts"] + 1)


class Clock:
    def __init__(self, now=1_000_000.0):
        self.now = now

    def __call__(self):
        return self.now


@pytest.fixture
def node(tmp_path, monkeypatch):
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    init = tmp_path / "init_comm"
    init.write_text("init\n")
    # Whatever runs this machine's PID 1, these tests say what it is.
    monkeypatch.setattr(slurmd_module, "PID1_COMM_PATH", str(init))
    monkeypatch.setattr(slurmd_module, "START_WAIT_S", 3.0)
    fake = FakeNode(folder)
    fake.init_comm = init
    yield fake
    for pid in fake.all_pids():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def systemd(node):
    node.init_comm.write_text("systemd\n")
    return FakeSystemd(node)


def process_watcher(node, **options):
    return SlurmdWatcher(node_name="gpu-001", pid_file=str(node.pid_file()), **options)


def one(events, signature, state="active"):
    [event] = [e for e in events if e["signature"] == signature and e["state"] == state]
    return event


def first_check(watcher):
    """The first check of a watcher that finds slurmd running: its one event is the
    `cleared` of a slurmd_down the server may hold open from before the agent started."""
    [cleared] = watcher.check_once()
    assert (cleared["signature"], cleared["state"], cleared["severity"]) == (
        "slurmd_down", "cleared", "info")
    assert cleared["message"] == f"slurmd on gpu-001 runs (pid {watcher.status()['pid']})"
    return cleared


# --- process mode ----------------------------------------------------------------------------


def test_a_killed_slurmd_is_restarted_in_place(node):
    first = node.start_slurmd()
    watcher = process_watcher(node)
    assert watcher.status() is None

    first_check(watcher)
    running = watcher.status()
    assert running["state"] == "running" and running["pid"] == first
    assert running["watched_by"] == "process" and running["restarts"] == 0
    assert abs(running["since"] - time.time()) < 5

    node.kill(first)
    [event] = watcher.check_once()

    second = node.pid()
    assert second != first and live_slurmd_started_at(second) is not None
    assert (event["signature"], event["severity"], event["state"], event["gpu_uuid"]) == (
        "slurmd_restarted", "info", "active", None)
    assert event["detail"]["ran_for_s"] >= 0
    assert {k: v for k, v in event["detail"].items() if k != "ran_for_s"} == {
        "previous_pid": first,
        "pid": second,
        "restarts_in_window": 1,
        "window_s": 600.0,
        "watched_by": "process",
        "command": "slurmd -N gpu-001",
    }
    assert re.fullmatch(
        rf"slurmd on gpu-001 was not running \(pid {first}, up \d s\): restarted, now pid "
        rf"{second} \(restart 1 in 10 min\)", event["message"])
    status = watcher.status()
    assert (status["state"], status["pid"], status["restarts"]) == ("running", second, 1)
    assert status["last_restart_at"] == pytest.approx(time.time(), abs=5)
    assert watcher.check_once() == []
    assert node.calls("slurmd") == ["-N gpu-001", "-N gpu-001"]


def test_a_slurmd_not_running_at_the_first_check_is_started(node):
    watcher = process_watcher(node)

    events = watcher.check_once()

    # The first check since the agent started: slurmd_down's cleared goes with the restart.
    assert [(e["signature"], e["state"]) for e in events] == [
        ("slurmd_down", "cleared"), ("slurmd_restarted", "active")]
    event = events[1]
    assert event["detail"]["previous_pid"] is None and event["detail"]["ran_for_s"] is None
    assert event["message"] == (f"slurmd on gpu-001 was not running: restarted, now pid "
                                f"{node.pid()} (restart 1 in 10 min)")


def test_the_status_holds_only_what_a_sample_can_carry(node):
    node.start_slurmd()
    watcher = process_watcher(node)
    watcher.check_once()

    status = watcher.status()

    assert set(status) == {"state", "pid", "since", "restarts", "last_restart_at",
                           "watched_by", "restart"}
    assert json.loads(json.dumps(status)) == status
    assert status["restart"] is True and status["last_restart_at"] is None


def test_a_failing_restart_opens_slurmd_down_once_retries_with_backoff_and_clears(node):
    clock = Clock()
    watcher = process_watcher(node, clock=clock)
    node.flag("fail")

    [down] = watcher.check_once()
    assert (down["signature"], down["severity"], down["state"]) == (
        "slurmd_down", "warning", "active")
    assert down["detail"] == {
        "why": "slurmd -N gpu-001 exited with status 1",
        "output_tail": "slurmd: error: Unable to bind listen port (6818): Address already in use",
        "watched_by": "process",
    }
    assert down["message"] == (
        "slurmd on gpu-001 is not running: slurmd -N gpu-001 exited with status 1")
    assert watcher.status()["state"] == "stopped" and watcher.status()["pid"] is None

    # Tried again after 5 s, then 10 s, 20 s: never re-sent while it stays down.
    attempts = []
    for step in (0, 5, 5, 5, 5, 5, 5, 5):
        clock.now += step
        assert watcher.check_once() == []
        attempts.append(len(node.calls("slurmd")))
    assert attempts == [1, 2, 2, 3, 3, 3, 3, 4]

    node.flag("fail", on=False)
    clock.now += 40
    events = watcher.check_once()
    cleared = one(events, "slurmd_down", "cleared")
    restarted = one(events, "slurmd_restarted")
    assert (cleared["severity"], cleared["message"]) == (
        "info", f"slurmd on gpu-001 runs again (pid {node.pid()})")
    assert restarted["detail"]["pid"] == node.pid()
    assert watcher.status()["state"] == "running"


def test_a_command_that_starts_no_slurmd_is_a_failed_restart(node, monkeypatch):
    monkeypatch.setattr(slurmd_module, "START_WAIT_S", 0.5)
    watcher = process_watcher(node)
    node.flag("start_nothing")

    [down] = watcher.check_once()

    assert down["detail"]["why"] == "no live slurmd within 0.5 s after slurmd -N gpu-001"


def test_a_restart_command_that_cannot_run_is_a_failed_restart(node):
    watcher = process_watcher(node, restart_command="/nonexistent/slurmd -N gpu-001")

    [down] = watcher.check_once()

    assert down["detail"]["why"].startswith(
        "/nonexistent/slurmd -N gpu-001 could not be run: [Errno 2]")


def test_with_restart_off_a_dead_slurmd_is_reported_and_its_return_cleared(node):
    watcher = process_watcher(node, restart=False)
    node.kill(node.start_slurmd())

    [down] = watcher.check_once()
    assert watcher.check_once() == []
    assert node.calls("slurmd") == ["-N gpu-001"]  # only the test's own start
    assert down["detail"]["why"] == "slurmd is not running and restarting it is off"
    assert watcher.status()["restart"] is False

    pid = node.start_slurmd()
    [cleared] = watcher.check_once()
    assert (cleared["signature"], cleared["state"], cleared["detail"]["pid"]) == (
        "slurmd_down", "cleared", pid)


def test_the_third_restart_within_the_window_opens_flapping_and_a_quiet_window_clears_it(node):
    clock = Clock()
    watcher = process_watcher(node, clock=clock)
    node.start_slurmd()
    watcher.check_once()

    signatures = []
    restart_times = []
    for _ in range(4):
        clock.now += 60
        node.kill(node.pid())
        events = watcher.check_once()
        signatures.append([e["signature"] for e in events])
        restart_times.append(clock.now)
    assert signatures == [["slurmd_restarted"], ["slurmd_restarted"],
                          ["slurmd_restarted", "slurmd_flapping"], ["slurmd_restarted"]]

    assert watcher.status()["restarts"] == 4

    clock.now = restart_times[3] + 599
    assert watcher.check_once() == []
    clock.now = restart_times[3] + 600
    [cleared] = watcher.check_once()
    assert (cleared["signature"], cleared["state"], cleared["severity"]) == (
        "slurmd_flapping", "cleared", "info")
    assert cleared["message"] == "slurmd on gpu-001 has run for 10 min without a restart"
    assert watcher.check_once() == []


def test_the_flapping_event_names_the_restarts_in_the_window(node):
    clock = Clock()
    watcher = process_watcher(node, clock=clock, flap_count=2, flap_window_s=120.0)
    node.start_slurmd()
    watcher.check_once()

    clock.now += 100
    node.kill(node.pid())
    watcher.check_once()
    clock.now += 130  # the first restart has left the window
    node.kill(node.pid())
    assert [e["signature"] for e in watcher.check_once()] == ["slurmd_restarted"]
    clock.now += 50
    node.kill(node.pid())
    events = watcher.check_once()

    flapping = one(events, "slurmd_flapping")
    assert flapping["severity"] == "warning"
    assert flapping["detail"] == {"restarts": 2, "window_s": 120.0,
                                  "restart_times": [1_000_230.0, 1_000_280.0]}
    assert flapping["message"] == "slurmd on gpu-001 was restarted 2 times in 2 min"
    assert one(events, "slurmd_restarted")["detail"]["restarts_in_window"] == 2


def test_restart_now_restarts_a_live_slurmd_without_counting_a_restart(node):
    first = node.start_slurmd()
    watcher = process_watcher(node)
    watcher.check_once()

    ok, message = watcher.restart_now("gres.conf rewritten")

    second = node.pid()
    assert ok and second != first
    assert live_slurmd_started_at(first) is None
    assert message == (f"slurmd on gpu-001 restarted (gres.conf rewritten): was pid {first}, "
                       f"now pid {second}")
    assert watcher.check_once() == []
    assert (watcher.status()["pid"], watcher.status()["restarts"]) == (second, 0)


def test_restart_now_kills_a_slurmd_that_ignores_sigterm(node, monkeypatch):
    monkeypatch.setattr(slurmd_module, "STOP_WAIT_S", 0.3)
    node.flag("ignore_term")
    first = node.start_slurmd()
    node.flag("ignore_term", on=False)
    watcher = process_watcher(node)

    ok, _ = watcher.restart_now("gres.conf rewritten")

    assert ok and live_slurmd_started_at(first) is None and node.pid() != first


def test_restart_now_reports_a_start_that_fails(node):
    watcher = process_watcher(node)
    node.flag("fail")

    ok, message = watcher.restart_now("gres.conf rewritten")

    assert not ok
    assert message == ("restarting slurmd on gpu-001 failed: slurmd -N gpu-001 exited with "
                       "status 1: slurmd: error: Unable to bind listen port (6818): Address "
                       "already in use")
    assert watcher.status()["state"] == "stopped"


def test_after_an_agent_restart_slurmd_down_and_flapping_are_cleared_once(node):
    # The server may hold either open from the agent's last run: the first check that
    # finds slurmd running clears slurmd_down, and slurmd_flapping once slurmd has run a
    # whole window without a restart.
    clock = Clock()
    node.start_slurmd()
    watcher = process_watcher(node, clock=clock)

    first_check(watcher)
    assert watcher.check_once() == []
    clock.now += 599
    assert watcher.check_once() == []
    clock.now += 1
    [cleared] = watcher.check_once()
    assert (cleared["signature"], cleared["state"]) == ("slurmd_flapping", "cleared")
    assert cleared["message"] == "slurmd on gpu-001 has run for 10 min without a restart"
    clock.now += 3600
    assert watcher.check_once() == []


def test_a_slurmd_up_a_whole_window_at_start_clears_flapping_at_the_first_check(node):
    node.start_slurmd()
    time.sleep(1.1)
    watcher = process_watcher(node, flap_window_s=1.0)

    events = watcher.check_once()

    assert [(e["signature"], e["state"]) for e in events] == [
        ("slurmd_down", "cleared"), ("slurmd_flapping", "cleared")]
    assert watcher.check_once() == []


def test_the_restarted_slurmd_gets_the_agents_environment_without_its_own_variables(
        node, monkeypatch):
    monkeypatch.setenv("CLUSTERUI_AGENT_TOKEN", "join-token-not-for-slurmd")
    monkeypatch.setenv("CLUSTERUI_SERVER", "wss://clusterui.example:8443")
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/slurm.conf")
    watcher = process_watcher(node)

    one(watcher.check_once(), "slurmd_restarted")

    names = (node.folder / "slurmd_environ").read_text().split()
    assert "PATH" in names and "SLURM_CONF" in names
    assert [name for name in names if name.startswith("CLUSTERUI")] == []


def test_a_restart_command_runs_without_the_agents_variables(monkeypatch):
    monkeypatch.setenv("CLUSTERUI_AGENT_TOKEN", "join-token")
    monkeypatch.setenv("NOT_CLUSTERUI_X", "kept")

    status, _, output = slurmd_module.run_restart_command(
        ["sh", "-c", 'echo "[${CLUSTERUI_AGENT_TOKEN-unset}] [$NOT_CLUSTERUI_X]"'])

    assert (status, output) == (0, "[unset] [kept]")


def test_the_pid_file_comes_from_scontrol_show_config(node, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.WARNING)
    fallback = tmp_path / "fallback.pid"
    monkeypatch.setattr(slurmd_module, "FALLBACK_PID_FILE", str(fallback))
    config = node.folder / "config"
    scontrol = node.folder / "scontrol"
    scontrol.write_text(
        "#!/bin/sh\n"
        f'if [ -f "{config}" ]; then cat "{config}"; exit 0; fi\n'
        'echo "slurm_load_ctl_conf error: Unable to contact slurm controller (connect '
        'failure)" >&2\nexit 1\n')
    scontrol.chmod(0o755)
    pid = node.start_slurmd()
    fallback.write_text(f"{pid}\n")
    watcher = SlurmdWatcher(node_name="gpu-001", restart=False)

    # slurmctld down: the default pid file, and one log line.
    first_check(watcher)
    assert watcher.check_once() == []
    assert watcher.status()["pid"] == pid
    [record] = caplog.records
    assert "Unable to contact slurm controller" in record.getMessage()

    config.write_text(
        "Configuration data as of 2026-11-29T14:02:11\n"
        "SlurmctldPidFile        = /run/slurmctld.pid\n"
        f"SlurmdPidFile           = {node.folder}/run/slurmd-%n.pid\n"
        "SlurmdPort              = 6818\n")
    fallback.unlink()
    assert watcher.check_once() == []
    assert watcher.pid_file == str(node.pid_file())
    assert watcher.status()["state"] == "running"


def test_the_thread_restarts_slurmd_and_hands_the_event_over(node):
    node.start_slurmd()
    watcher = process_watcher(node, interval_s=0.05)
    watcher.start()
    try:
        deadline = time.monotonic() + 5
        while watcher.status() is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        node.kill(node.pid())
        events = []
        while "slurmd_restarted" not in [e["signature"] for e in events]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
            events += watcher.poll([])
    finally:
        watcher.close()

    assert [(e["signature"], e["state"]) for e in events] == [
        ("slurmd_down", "cleared"), ("slurmd_restarted", "active")]


# --- systemd mode ----------------------------------------------------------------------------


def test_systemd_is_used_where_it_runs_the_unit(node, systemd):
    pid = systemd.run_slurmd()
    watcher = SlurmdWatcher(node_name="gpu-001")

    first_check(watcher)

    status = watcher.status()
    assert (status["watched_by"], status["state"], status["pid"]) == ("systemd", "running", pid)
    assert abs(status["since"] - time.time()) < 5
    assert node.calls("systemctl")[0] == (
        "show slurmd -p LoadState,ActiveState,SubState,Result,MainPID,"
        "ExecMainStartTimestampMonotonic,NRestarts")


def test_a_unit_systemd_does_not_know_means_watching_the_process(node, systemd):
    systemd.write(LoadState="not-found")
    node.start_slurmd()
    watcher = process_watcher(node)

    watcher.check_once()

    assert watcher.status()["watched_by"] == "process"


def test_a_restart_by_systemd_itself_is_counted_and_reported(node, systemd):
    first = systemd.run_slurmd(restarts=4)
    watcher = SlurmdWatcher(node_name="gpu-001")
    watcher.check_once()

    second = systemd.restart_by_itself()
    [event] = watcher.check_once()

    assert event["signature"] == "slurmd_restarted"
    assert event["message"].startswith(
        f"slurmd on gpu-001 was restarted by systemd (pid {first}, up ")
    assert event["message"].endswith(f"), now pid {second} (restart 1 in 10 min)")
    assert event["detail"]["command"] is None
    assert event["detail"]["watched_by"] == "systemd"
    assert watcher.status()["restarts"] == 1
    assert watcher.check_once() == []
    assert not any(call.startswith("restart") for call in node.calls("systemctl"))


def test_systemd_restarting_it_over_and_over_is_flapping(node, systemd):
    systemd.run_slurmd()
    watcher = SlurmdWatcher(node_name="gpu-001")
    watcher.check_once()

    signatures = []
    for _ in range(3):
        systemd.restart_by_itself()
        signatures += [e["signature"] for e in watcher.check_once()]

    assert signatures == ["slurmd_restarted"] * 3 + ["slurmd_flapping"]


def test_a_failed_unit_is_restarted_with_systemctl(node, systemd):
    first = systemd.run_slurmd(restarts=2)
    watcher = SlurmdWatcher(node_name="gpu-001")
    watcher.check_once()
    node.kill(first)
    systemd.write(MainPID=0, ActiveState="failed", SubState="failed")

    [event] = watcher.check_once()

    assert event["detail"]["command"] == "systemctl restart slurmd"
    assert event["detail"]["pid"] == systemd.state()["MainPID"] != first
    assert "restart slurmd" in node.calls("systemctl")
    # systemctl restart set NRestarts back to 0; a later restart by systemd is one more.
    systemd.restart_by_itself()
    [again] = watcher.check_once()
    assert again["detail"]["restarts_in_window"] == 2 and again["detail"]["command"] is None


def test_a_unit_stopped_on_purpose_is_reported_not_restarted_and_cleared_when_it_runs(
        node, systemd):
    first = systemd.run_slurmd()
    watcher = SlurmdWatcher(node_name="gpu-001")
    first_check(watcher)
    # `systemctl stop slurmd` for maintenance: inactive, Result=success.
    node.kill(first)
    systemd.write(MainPID=0, ActiveState="inactive", SubState="dead", Result="success")

    [down] = watcher.check_once()

    assert (down["signature"], down["severity"], down["state"]) == (
        "slurmd_down", "warning", "active")
    assert down["detail"] == {"why": "stopped on purpose (systemctl stop): not restarted",
                              "output_tail": "", "watched_by": "systemd"}
    assert down["message"] == ("slurmd on gpu-001 is not running: stopped on purpose "
                               "(systemctl stop): not restarted")
    assert watcher.status()["state"] == "stopped" and watcher.status()["pid"] is None
    assert watcher.check_once() == [] and watcher.check_once() == []
    assert not any(call.startswith("restart") for call in node.calls("systemctl"))

    second = systemd.run_slurmd()  # `systemctl start slurmd` after the maintenance
    [cleared] = watcher.check_once()
    assert (cleared["signature"], cleared["state"], cleared["detail"]["pid"]) == (
        "slurmd_down", "cleared", second)
    assert cleared["message"] == f"slurmd on gpu-001 runs again (pid {second})"
    assert watcher.status()["restarts"] == 0


def test_an_inactive_unit_whose_result_is_a_failure_is_restarted(node, systemd):
    first = systemd.run_slurmd()
    watcher = SlurmdWatcher(node_name="gpu-001")
    first_check(watcher)
    node.kill(first)
    systemd.write(MainPID=0, ActiveState="inactive", SubState="dead", Result="signal")

    [event] = watcher.check_once()

    assert event["signature"] == "slurmd_restarted"
    assert event["detail"]["command"] == "systemctl restart slurmd"
    assert "restart slurmd" in node.calls("systemctl")


def test_a_unit_systemd_is_starting_is_left_to_systemd(node, systemd):
    systemd.write(ActiveState="activating", SubState="auto-restart", MainPID=0)
    watcher = SlurmdWatcher(node_name="gpu-001")

    assert watcher.check_once() == []

    assert watcher.status()["state"] == "restarting"
    assert not any(call.startswith("restart") for call in node.calls("systemctl"))


def test_a_refused_systemctl_restart_is_slurmd_down_with_its_output(node, systemd):
    systemd.write(ActiveState="failed", SubState="failed")
    node.flag("refuse")
    watcher = SlurmdWatcher(node_name="gpu-001")

    [down] = watcher.check_once()

    assert down["detail"]["why"] == "systemctl restart slurmd exited with status 1"
    assert down["detail"]["output_tail"].startswith(
        "Job for slurmd.service failed because the control process exited with error code.")
    assert down["detail"]["watched_by"] == "systemd"


def test_restart_now_under_systemd_uses_systemctl(node, systemd):
    first = systemd.run_slurmd()
    watcher = SlurmdWatcher(node_name="gpu-001")
    watcher.check_once()

    ok, message = watcher.restart_now("gres.conf rewritten")

    assert ok and systemd.state()["MainPID"] != first
    assert "restart slurmd" in node.calls("systemctl")
    assert watcher.check_once() == [] and watcher.status()["restarts"] == 0


# --- helpers ---------------------------------------------------------------------------------


def test_a_zombie_or_another_program_is_not_a_live_slurmd(node):
    foreground = subprocess.Popen([str(node.folder / "slurmd"), "-D", "-N", "zombie"])
    try:
        deadline = time.monotonic() + 5
        while node.pid("zombie") != foreground.pid:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert live_slurmd_started_at(foreground.pid) == pytest.approx(time.time(), abs=5)
        os.kill(foreground.pid, signal.SIGKILL)
        while open(f"/proc/{foreground.pid}/stat").read().split()[2] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert live_slurmd_started_at(foreground.pid) is None  # not reaped yet: a zombie
    finally:
        foreground.kill()
        foreground.wait()
    assert live_slurmd_started_at(os.getpid()) is None
    assert live_slurmd_started_at(foreground.pid) is None


PROC_STAT_TAIL = (" S 1 4242 4242 0 -1 4194624 500 0 0 0 3 1 0 0 20 0 1 0 {ticks} "
                  "11000000 900 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 3 0 0\n")


def fake_proc(tmp_path, monkeypatch, processes, *, btime=1_700_000_000):
    """A /proc of the test's own: /proc/stat with `btime` (None: no /proc/stat) and
    /proc/<pid>/stat holding the bytes given for each pid."""
    proc = tmp_path / "proc"
    proc.mkdir()
    if btime is not None:
        (proc / "stat").write_text(f"cpu  1 2 3 4\nbtime {btime}\nprocesses 9\n")
    for pid, stat in processes.items():
        (proc / str(pid)).mkdir()
        (proc / str(pid) / "stat").write_bytes(stat)
    monkeypatch.setattr(slurmd_module, "PROC", str(proc))
    return proc


def test_proc_bytes_that_are_not_utf8_do_not_break_the_reading(tmp_path, monkeypatch):
    tick = os.sysconf("SC_CLK_TCK")
    fake_proc(tmp_path, monkeypatch, {
        4242: b"4242 (slurmd)" + PROC_STAT_TAIL.format(ticks=5 * tick).encode(),
        4243: b"4243 (slurm\xffd \xfe)" + PROC_STAT_TAIL.format(ticks=tick).encode(),
        4244: b"4244 (slurmd) S 1\n",  # cut short
    })

    assert live_slurmd_started_at(4242) == 1_700_000_005
    assert live_slurmd_started_at(4243) is None
    assert live_slurmd_started_at(4244) is None


def test_a_pid_file_or_pid_1_comm_that_is_not_utf8_is_read_without_failing(node, tmp_path,
                                                                          monkeypatch):
    pid_file = tmp_path / "slurmd.pid"
    pid_file.write_bytes(b"\xff\xfe4242\n")
    assert slurmd_module.read_pid_file(str(pid_file)) is None
    pid_file.write_bytes("\u00b2\n".encode())  # a digit to str.isdigit(), not to int()
    assert slurmd_module.read_pid_file(str(pid_file)) is None
    node.init_comm.write_bytes(b"syst\xffemd\n")
    node.start_slurmd()
    watcher = process_watcher(node)

    first_check(watcher)

    assert watcher.status()["watched_by"] == "process"


def test_an_unreadable_proc_skips_the_check_and_restarts_nothing(node, tmp_path, monkeypatch,
                                                                 caplog):
    caplog.set_level(logging.WARNING)
    pid = node.start_slurmd()
    tick = os.sysconf("SC_CLK_TCK")
    fake_proc(tmp_path, monkeypatch,
              {pid: f"{pid} (slurmd)".encode() + PROC_STAT_TAIL.format(ticks=tick).encode()},
              btime=None)
    watcher = process_watcher(node)

    assert watcher.check_once() == [] and watcher.check_once() == []

    assert watcher.status() is None
    assert node.calls("slurmd") == ["-N gpu-001"]  # only the test's own start
    [record] = caplog.records
    assert "slurmd's start time cannot be read" in record.getMessage()
    ok, message = watcher.restart_now("gres.conf rewritten")
    assert not ok and "cannot be read" in message


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "kill"])
def test_a_signal_goes_only_to_the_slurmd_that_was_read(node, monkeypatch, pidfd):
    if not pidfd:
        monkeypatch.delattr(os, "pidfd_open")
    pid = node.start_slurmd()
    started_at = live_slurmd_started_at(pid)

    # The pid now names another process (or the same pid started again): not signalled.
    assert slurmd_module.signal_slurmd(pid, started_at + 1.0, signal.SIGKILL) is False
    assert live_slurmd_started_at(pid) == started_at
    other = subprocess.Popen(["sleep", "30"])
    try:
        assert slurmd_module.signal_slurmd(other.pid, started_at, signal.SIGKILL) is False
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()

    assert slurmd_module.signal_slurmd(pid, started_at, signal.SIGKILL) is True
    deadline = time.monotonic() + 5
    while live_slurmd_started_at(pid) is not None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert slurmd_module.signal_slurmd(pid, started_at, signal.SIGKILL) is False


def test_a_restart_command_whose_child_keeps_its_output_does_not_hang():
    started = time.monotonic()

    status, why, output = slurmd_module.run_restart_command(
        ["sh", "-c", "sleep 3 & echo daemon started"])

    assert time.monotonic() - started < 2
    assert (status, why, output) == (0, "", "daemon started")


@pytest.mark.parametrize("seconds, text", [
    (0, "0 s"), (59.9, "59 s"), (600, "10 min"), (3 * 3600 + 2 * 60 + 5, "3 h 2 min"),
    (2 * 86400 + 3600, "2 d 1 h"),
])
def test_durations_read_as_an_operator_would_say_them(seconds, text):
    assert format_duration(seconds) == text
