"""slurmd kept alive: a node whose slurmd died takes no jobs, and Slurm only notices after
SlurmdTimeout (5 min by default), then marks the node down. The agent checks slurmd every
`interval_s` seconds (5) in a thread and starts it again in place.

How slurmd is watched (`watched_by`):

- "systemd" where systemd is PID 1 and `systemctl show <unit>` says the unit is loaded:
  systemd's ActiveState says whether slurmd runs, MainPID which process it is,
  ExecMainStartTimestampMonotonic since when, and NRestarts counts the restarts systemd's
  own Restart= made (counted here like ours). A restart is `systemctl restart <unit>`.
  Only a unit that failed is restarted: ActiveState=failed, or inactive with a Result
  other than success. A unit stopped on purpose (`systemctl stop` for maintenance or an
  upgrade: inactive, Result=success) is left stopped: the status says "stopped" and
  slurmd_down opens once ("stopped on purpose (systemctl stop): not restarted"), cleared
  when the unit runs again.
- "process" elsewhere: the pid in slurmd's pid file (`scontrol show config`'s
  SlurmdPidFile, %n replaced by the node name; /run/slurmd.pid while scontrol cannot
  answer). slurmd runs when /proc/<pid> exists, its comm is slurmd and it is not a zombie
  (a daemon's parent may never reap it). A restart is `slurmd -N <node>`, which
  daemonizes and writes its pid file. /proc and the pid file are read as bytes, what is
  not UTF-8 replaced; a /proc that cannot be read skips the check (logged once), it
  never restarts a slurmd that may be running. Before a signal to a slurmd (restart_now)
  the pid is checked again to be that slurmd (its start time), through a pidfd where
  the kernel has them, so a pid reused since it was read is never signalled.

Events (no GPU):

    slurmd_restarted  info     slurmd was found dead and started again, or systemd did it
    slurmd_down       warning  dead and not restarted: the restart failed (tried again at
                               each check, after 5 s, doubling to 5 min) or restarting is
                               off; `cleared` once slurmd runs again
    slurmd_flapping   warning  `flap_count` restarts within `flap_window_s`; `cleared` once
                               slurmd has run for a whole window without a restart

At start the watcher does not know what the server holds open (an agent restart forgets
it), so both are taken as possibly open: the first check that finds slurmd running sends
slurmd_down's `cleared`, and slurmd_flapping's `cleared` goes once slurmd has run a whole
window without a restart (at once when it has been up that long). The server ignores a
`cleared` with nothing open.

restart_now() restarts a live slurmd on request (after gres.conf changed): not a flap.
The restart command runs without a shell, in its own session, with its output in a
temporary file (a daemonizing child that kept an inherited pipe would hang the agent),
and with the agent's environment less every CLUSTERUI_* variable: a slurmd the agent
starts must not inherit the agent's token (CLUSTERUI_AGENT_TOKEN) or other settings."""

import logging
import os
import re
import shlex
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass

from agent.connection.protocol import event_frame
from agent.detectors.polling import PollingWatcher

log = logging.getLogger(__name__)

SLURMD_INTERVAL_S = 5.0
FLAP_COUNT = 3
FLAP_WINDOW_S = 600.0
RESTART_COMMAND_TIMEOUT_S = 30
START_WAIT_S = 15.0  # for a live slurmd after the restart command
STOP_WAIT_S = 10.0  # for a SIGTERMed slurmd to exit before SIGKILL
QUERY_TIMEOUT_S = 15  # systemctl show, scontrol show config (9 s with slurmctld down)
RETRY_FIRST_S = 5.0
RETRY_MAX_S = 300.0
OUTPUT_TAIL_CHARS = 1000
FALLBACK_PID_FILE = "/run/slurmd.pid"
PID1_COMM_PATH = "/proc/1/comm"
PROC = "/proc"
SYSTEMD_PROPERTIES = (
    "LoadState", "ActiveState", "SubState", "Result", "MainPID",
    "ExecMainStartTimestampMonotonic", "NRestarts",
)
STOPPED_ON_PURPOSE = "stopped on purpose (systemctl stop): not restarted"
AGENT_ENV_PREFIX = "CLUSTERUI_"  # the agent's own settings, its token among them


class WatchError(Exception):
    """slurmd's state could not be read (systemctl failed); the message says why."""


@dataclass
class Observation:
    """What one look at slurmd found. `pid` is the live process, or while dead the pid it
    last had where that is known (a stale pid file); `started_at` is a unix time."""

    alive: bool
    pid: int | None = None
    started_at: float | None = None
    changing: bool = False  # systemd is starting or stopping it: wait
    systemd_restarts: int | None = None  # NRestarts
    stopped_on_purpose: bool = False  # systemd: inactive with Result=success


# --- reading the process and systemd ------------------------------------------------------


def read_text(path):
    """A small file's text, read as bytes with what is not UTF-8 replaced: a comm or a pid
    file holds whatever bytes were written there. Raises OSError."""
    with open(path, "rb") as f:
        return f.read().decode(errors="replace")


def read_pid_file(path):
    """The pid in a pid file, or None when it cannot be read or holds no pid."""
    try:
        text = read_text(path).strip()
    except OSError:
        return None
    return int(text) if re.fullmatch(r"[0-9]{1,10}", text) else None


def boot_time():
    """The unix time the machine booted (/proc/stat btime). Raises OSError."""
    for line in read_text(f"{PROC}/stat").splitlines():
        if line.startswith("btime "):
            try:
                return float(line.split()[1])
            except (IndexError, ValueError):
                break
    raise OSError(f"{PROC}/stat has no readable btime line")


def live_slurmd_started_at(pid):
    """The unix time `pid` started if it is a live slurmd, else None. Raises OSError when
    /proc/stat (the boot time) cannot be read: the caller cannot tell then."""
    try:
        stat = read_text(f"{PROC}/{pid}/stat")
    except OSError:
        return None
    # "4242 (slurmd) S 1 ...": the comm may hold spaces or ")", so cut at the last ")".
    comm = stat[stat.find("(") + 1 : stat.rfind(")")]
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        state, start_ticks = fields[0], int(fields[19])  # fields 3 and 22 of proc(5)
    except (IndexError, ValueError):
        return None
    if comm != "slurmd" or state in ("Z", "X"):
        return None
    return boot_time() + start_ticks / os.sysconf("SC_CLK_TCK")


def signal_slurmd(pid, started_at, sig):
    """Send `sig` to `pid` only while it is still the slurmd that started at `started_at`
    (live_slurmd_started_at's value when the pid was read): True when sent, False when
    that slurmd is gone (the pid dead, a zombie, or reused by another process).

    Where the kernel has pidfds the pid is pinned first (os.pidfd_open), then checked,
    then signalled through the pidfd: the check and the signal are about one process
    even if the pid is reused in between. Elsewhere the check is made right before
    os.kill."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):  # no pidfd_open (Python, kernel before 5.3)
        pidfd = None
    try:
        try:
            if live_slurmd_started_at(pid) != started_at:
                return False
        except OSError:  # /proc/stat unreadable: cannot tell, so do not signal
            return False
        try:
            if pidfd is not None:
                signal.pidfd_send_signal(pidfd, sig)
            else:
                os.kill(pid, sig)
        except ProcessLookupError:
            return False
        return True
    finally:
        if pidfd is not None:
            os.close(pidfd)


def parse_systemctl_show(text):
    """{property: value} from `systemctl show` lines ("MainPID=4242")."""
    properties = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            properties[key.strip()] = value.strip()
    return properties


def slurmd_pid_file_from_config(text, node_name):
    """SlurmdPidFile from `scontrol show config` ("SlurmdPidFile  = /run/slurmd-%n.pid")
    with %n replaced, or None when the output has no such line."""
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "SlurmdPidFile":
            return value.strip().replace("%n", node_name)
    return None


def format_duration(seconds):
    """"45 s", "12 min", "3 h 2 min", "2 d 5 h"."""
    seconds = int(max(seconds, 0))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min"
    if seconds < 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"{seconds // 86400} d {seconds % 86400 // 3600} h"


def restart_environment():
    """The agent's environment less every CLUSTERUI_* variable, for the restart command:
    a slurmd the agent starts keeps running long after, with whatever it inherited."""
    return {key: value for key, value in os.environ.items()
            if not key.startswith(AGENT_ENV_PREFIX)}


def run_restart_command(argv):
    """Run a restart command (with restart_environment()): (exit status or None when it
    could not run or finish, why it failed or "", the end of its output)."""
    command = shlex.join(argv)
    with tempfile.TemporaryFile() as output:
        try:
            result = subprocess.run(
                argv, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                start_new_session=True, timeout=RESTART_COMMAND_TIMEOUT_S,
                env=restart_environment(),
            )
            status = result.returncode
            why = "" if status == 0 else f"{command} exited with status {status}"
        except OSError as exc:
            status, why = None, f"{command} could not be run: {exc}"
        except subprocess.TimeoutExpired:
            status = None
            why = f"{command} did not finish within {RESTART_COMMAND_TIMEOUT_S} s"
        output.seek(0)
        text = output.read().decode(errors="replace").strip()
    return status, why, text[-OUTPUT_TAIL_CHARS:]


# --- the watcher -----------------------------------------------------------------------------


class SlurmdWatcher(PollingWatcher):
    thread_name = "slurmd"

    def __init__(self, *, node_name, unit="slurmd", pid_file=None, restart_command=None,
                 restart=True, flap_count=FLAP_COUNT, flap_window_s=FLAP_WINDOW_S,
                 interval_s=SLURMD_INTERVAL_S, clock=time.time, watched_by=None):
        """restart_command: a command line (split like a shell's, run without one);
        default `systemctl restart <unit>` or `slurmd -N <node_name>`. watched_by:
        "systemd" or "process" to skip the detection (None: detect at the first check)."""
        super().__init__(interval_s)
        self.node_name = node_name
        self.unit = unit
        self.pid_file = pid_file
        self.restart_command = restart_command
        self.restart = restart
        self.flap_count = flap_count
        self.flap_window_s = flap_window_s
        self._clock = clock
        self.watched_by = watched_by
        self._lock = threading.Lock()  # one check or restart_now at a time
        self._status = None
        self._pid = None  # the slurmd last seen running
        self._since = None  # when it started, on self._clock
        self._systemd_restarts = None  # NRestarts last seen
        self._restart_times = []  # this agent run's restarts within the flap window
        self._restarts = 0
        self._last_restart_at = None
        # True open, False closed, None unknown (at start: the server may hold either
        # open from before an agent restart).
        self._down_open = None
        self._flapping_open = None
        self._retry_at = None  # no restart before this time after a failed one
        self._retry_delay_s = RETRY_FIRST_S
        self._read_failing = False
        self._config_failing = False

    def status(self):
        """The sample's view: None before the first check."""
        return None if self._status is None else dict(self._status)

    # --- the check ---------------------------------------------------------------------------

    def check_once(self):
        with self._lock:
            if self.watched_by is None:
                self.watched_by = self._detect_watched_by()
            try:
                seen = self._observe()
            except WatchError as exc:
                if not self._read_failing:
                    self._read_failing = True
                    log.warning("%s (tried again every %g s)", exc, self.interval_s)
                return []
            self._read_failing = False
            now = self._clock()
            if seen.alive:
                events = self._found_running(seen, now)
            elif seen.changing:
                self._set_status("restarting")
                events = []
            else:
                events = self._found_dead(seen, now)
            return events + self._flapping_cleared(now)

    def _found_running(self, seen, now):
        by_systemd = 0
        if self._systemd_restarts is not None and seen.systemd_restarts is not None:
            by_systemd = max(seen.systemd_restarts - self._systemd_restarts, 0)
        self._systemd_restarts = seen.systemd_restarts
        previous_pid, previous_since = self._pid, self._since
        self._remember_running(seen, now)
        events = self._down_cleared()
        if by_systemd and seen.pid != previous_pid:
            events += self._restarted(previous_pid, previous_since, now, command=None,
                                      count=by_systemd)
        return events

    def _found_dead(self, seen, now):
        previous_pid = self._pid if self._pid is not None else seen.pid
        previous_since = self._since if self._pid is not None else None
        self._pid = self._since = None
        self._set_status("stopped")
        if seen.stopped_on_purpose:
            return self._down(STOPPED_ON_PURPOSE, "")
        if not self.restart:
            return self._down("slurmd is not running and restarting it is off", "")
        if self._retry_at is not None and now < self._retry_at:
            return []
        self._set_status("restarting")
        argv = self._restart_argv()
        ok, why, output = self._start(argv, previous_pid)
        if not ok:
            self._set_status("stopped")
            self._retry_at = now + self._retry_delay_s
            self._retry_delay_s = min(self._retry_delay_s * 2, RETRY_MAX_S)
            return self._down(why, output)
        return self._down_cleared() + self._restarted(previous_pid, previous_since, self._clock(),
                                        command=shlex.join(argv))

    def _restarted(self, previous_pid, previous_since, at, *, command, count=1):
        """Count `count` restarts at `at`: a slurmd_restarted event, and slurmd_flapping
        when they reach flap_count within the window."""
        self._restarts += count
        self._last_restart_at = at
        self._set_status("running")  # with the new count
        self._restart_times = [t for t in self._restart_times if t > at - self.flap_window_s]
        self._restart_times += [at] * count
        in_window = len(self._restart_times)
        ran_for_s = None if previous_since is None else round(max(at - previous_since, 0), 1)

        what = []
        if previous_pid is not None:
            what.append(f"pid {previous_pid}")
        if ran_for_s is not None:
            what.append(f"up {format_duration(ran_for_s)}")
        before = f" ({', '.join(what)})" if what else ""
        window = format_duration(self.flap_window_s)
        if command is None:
            message = (f"slurmd on {self.node_name} was restarted by systemd{before}, now pid "
                       f"{self._pid} (restart {in_window} in {window})")
        else:
            message = (f"slurmd on {self.node_name} was not running{before}: restarted, now "
                       f"pid {self._pid} (restart {in_window} in {window})")
        events = [event_frame(
            signature="slurmd_restarted", severity="info", message=message,
            detail={
                "previous_pid": previous_pid,
                "ran_for_s": ran_for_s,
                "pid": self._pid,
                "restarts_in_window": in_window,
                "window_s": self.flap_window_s,
                "watched_by": self.watched_by,
                "command": command,
            })]
        if in_window >= self.flap_count and not self._flapping_open:
            self._flapping_open = True
            events.append(event_frame(
                signature="slurmd_flapping", severity="warning",
                message=(f"slurmd on {self.node_name} was restarted {in_window} times in "
                         f"{window}"),
                detail={"restarts": in_window, "window_s": self.flap_window_s,
                        "restart_times": [round(t, 3) for t in self._restart_times]}))
        return events

    def _flapping_cleared(self, now):
        """slurmd_flapping's `cleared` once slurmd has run a whole window without a
        restart, when it is open or unknown (the first window after the agent started)."""
        if self._flapping_open is False or self._pid is None:
            return []
        quiet_since = self._since
        if self._last_restart_at is not None:
            quiet_since = max(self._last_restart_at, self._since)
        if now - quiet_since < self.flap_window_s:
            return []
        self._flapping_open = False
        return [event_frame(
            signature="slurmd_flapping", severity="info", state="cleared",
            message=(f"slurmd on {self.node_name} has run for "
                     f"{format_duration(self.flap_window_s)} without a restart"),
            detail={"restarts": 0, "window_s": self.flap_window_s, "restart_times": []})]

    def _down_cleared(self):
        """slurmd runs (self._pid): the end of an open slurmd_down, and of the backoff.
        Sent too at the first check of the agent's run (unknown: the server may hold one
        open from before the agent restarted)."""
        self._retry_at, self._retry_delay_s = None, RETRY_FIRST_S
        if self._down_open is False:
            return []
        again = " again" if self._down_open else ""
        self._down_open = False
        return [event_frame(
            signature="slurmd_down", severity="info", state="cleared",
            message=f"slurmd on {self.node_name} runs{again} (pid {self._pid})",
            detail={"pid": self._pid, "watched_by": self.watched_by})]

    def _down(self, why, output):
        self._set_status("stopped")
        if self._down_open:
            return []
        self._down_open = True
        log.warning("slurmd on %s is down: %s", self.node_name, why)
        return [event_frame(
            signature="slurmd_down", severity="warning",
            message=f"slurmd on {self.node_name} is not running: {why}",
            detail={"why": why, "output_tail": output, "watched_by": self.watched_by})]

    # --- restart on request ------------------------------------------------------------------

    def restart_now(self, reason):
        """Restart slurmd now, live or not (it reads slurm.conf and gres.conf again):
        (ok, message). Not counted as a restart or a flap."""
        with self._lock:
            if self.watched_by is None:
                self.watched_by = self._detect_watched_by()
            try:
                seen = self._observe()
            except WatchError as exc:
                return False, str(exc)
            previous_pid = seen.pid if seen.alive else None
            self._set_status("restarting")
            if previous_pid is not None and self.watched_by == "process":
                self._stop_process(previous_pid, seen.started_at)
            argv = self._restart_argv()
            ok, why, output = self._start(argv, previous_pid)
            if not ok:
                self._pid = self._since = None
                self._set_status("stopped")
                tail = f": {output}" if output else ""
                return False, f"restarting slurmd on {self.node_name} failed: {why}{tail}"
            self._set_status("running")
            was = f"pid {previous_pid}" if previous_pid is not None else "not running"
            log.info("slurmd on %s restarted (%s): %s, now pid %s", self.node_name, reason,
                     was, self._pid)
            return True, (f"slurmd on {self.node_name} restarted ({reason}): was {was}, "
                          f"now pid {self._pid}")

    def _stop_process(self, pid, started_at):
        """SIGTERM, SIGKILL after STOP_WAIT_S, to the slurmd `pid` that started at
        `started_at`, each signal only while the pid is still that slurmd
        (signal_slurmd); returns once it is gone (or a zombie)."""
        for sig, wait_s in ((signal.SIGTERM, STOP_WAIT_S), (signal.SIGKILL, 5.0)):
            if not signal_slurmd(pid, started_at, sig):
                return
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                if not self._same_slurmd(pid, started_at):
                    return
                time.sleep(0.1)

    @staticmethod
    def _same_slurmd(pid, started_at):
        try:
            return live_slurmd_started_at(pid) == started_at
        except OSError:  # /proc/stat unreadable: cannot tell; the next signal checks again
            return True

    # --- starting --------------------------------------------------------------------------

    def _restart_argv(self):
        if self.restart_command:
            return shlex.split(self.restart_command)
        if self.watched_by == "systemd":
            return ["systemctl", "restart", self.unit]
        return ["slurmd", "-N", self.node_name]

    def _start(self, argv, previous_pid):
        """Run the restart command and wait for a live slurmd with a new pid:
        (ok, why, output tail). On success self._pid and self._since are the new one's."""
        log.info("starting slurmd on %s: %s", self.node_name, shlex.join(argv))
        status, why, output = run_restart_command(argv)
        if status != 0:
            return False, why, output
        deadline = time.monotonic() + START_WAIT_S
        while True:
            try:
                seen = self._observe()
            except WatchError:
                seen = Observation(alive=False)
            if seen.alive and seen.pid != previous_pid:
                self._remember_running(seen, self._clock())
                self._systemd_restarts = seen.systemd_restarts
                return True, "", output
            if time.monotonic() > deadline:
                return False, (f"no live slurmd within {START_WAIT_S:g} s after "
                               f"{shlex.join(argv)}"), output
            time.sleep(0.2)

    def _remember_running(self, seen, now):
        if seen.pid != self._pid or self._since is None:
            # On the watcher's clock, kept for the process's life (a test's clock moves
            # on its own).
            uptime_s = 0.0 if seen.started_at is None else max(time.time() - seen.started_at, 0)
            self._pid, self._since = seen.pid, now - uptime_s
        self._set_status("running")

    def _set_status(self, state):
        running = state == "running"
        self._status = {
            "state": state,
            "pid": self._pid if running else None,
            "since": self._since if running else None,
            "restarts": self._restarts,
            "last_restart_at": self._last_restart_at,
            "watched_by": self.watched_by,
            "restart": self.restart,
        }

    # --- observing ---------------------------------------------------------------------------

    def _detect_watched_by(self):
        try:
            init = read_text(PID1_COMM_PATH).strip()
        except OSError:
            init = ""
        if init == "systemd":
            try:
                if self._systemctl_show().get("LoadState") == "loaded":
                    return "systemd"
            except WatchError as exc:
                log.info("%s: watching slurmd's process instead", exc)
        return "process"

    def _observe(self):
        if self.watched_by == "systemd":
            return self._observe_systemd()
        return self._observe_process()

    def _observe_systemd(self):
        properties = self._systemctl_show()
        pid = int(properties.get("MainPID") or 0) or None
        active = properties.get("ActiveState", "")
        restarts = properties.get("NRestarts", "")
        started_us = int(properties.get("ExecMainStartTimestampMonotonic") or 0)
        started_at = None
        if started_us:
            started_at = time.time() - (time.monotonic() - started_us / 1e6)
        return Observation(
            alive=active in ("active", "reloading") and pid is not None,
            pid=pid,
            started_at=started_at,
            changing=active in ("activating", "deactivating"),
            systemd_restarts=int(restarts) if restarts.isdigit() else None,
            # A failed unit is "failed", or inactive with the failure in Result
            # (exit-code, signal, timeout...); `systemctl stop` leaves Result=success.
            stopped_on_purpose=active == "inactive" and properties.get("Result") == "success",
        )

    def _systemctl_show(self):
        argv = ["systemctl", "show", self.unit, "-p", ",".join(SYSTEMD_PROPERTIES)]
        try:
            result = subprocess.run(argv, capture_output=True, text=True,
                                    timeout=QUERY_TIMEOUT_S, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise WatchError(f"{shlex.join(argv)} failed: {exc}") from exc
        if result.returncode != 0:
            raise WatchError(f"{shlex.join(argv)} failed: "
                             f"{(result.stderr or result.stdout).strip()}")
        return parse_systemctl_show(result.stdout)

    def _observe_process(self):
        pid = read_pid_file(self._pid_file_path())
        try:
            started_at = None if pid is None else live_slurmd_started_at(pid)
        except OSError as exc:
            raise WatchError(f"slurmd's start time cannot be read: {exc}") from exc
        return Observation(alive=started_at is not None, pid=pid, started_at=started_at)

    def _pid_file_path(self):
        """The given pid file, else slurmd's from `scontrol show config` (kept once read),
        else FALLBACK_PID_FILE for this check."""
        if self.pid_file:
            return self.pid_file
        argv = ["scontrol", "show", "config"]
        try:
            result = subprocess.run(argv, capture_output=True, text=True,
                                    timeout=QUERY_TIMEOUT_S, stdin=subprocess.DEVNULL)
            path = None
            if result.returncode == 0:
                path = slurmd_pid_file_from_config(result.stdout, self.node_name)
            problem = (result.stderr.strip() or "no SlurmdPidFile in its output")
        except (OSError, subprocess.TimeoutExpired) as exc:
            path, problem = None, str(exc)
        if path:
            self.pid_file = path
            return path
        if not self._config_failing:
            self._config_failing = True
            log.warning("scontrol show config failed (%s): reading slurmd's pid from %s "
                        "until it answers", problem, FALLBACK_PID_FILE)
        return FALLBACK_PID_FILE
