"""Helpers for the real-socket integration tests: the processes of a deployment (daphne, a
Celery worker and beat, real agents) as subprocesses, each with a log under test-artifacts/,
and bounded waits.

Every process starts through a ProcessGroup (the `processes` fixture in conftest.py), which
stops what is still running at the end of the test, also when it failed, and then, if it
failed, prints the tail of every log.
"""

import json
import os
import pwd
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from agent.cli import OUTBOX_FILE as AGENT_OUTBOX

from .browser import REPO_ROOT, _die_with_parent, free_port


def wait_until(predicate, *, timeout, what, interval=0.05):
    """Poll `predicate` until it returns something truthy (returned) or `timeout` seconds
    pass (AssertionError naming `what`, with the predicate's last value)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what} (last: {value!r})")
        time.sleep(interval)


class Process:
    """A subprocess with its stdout and stderr in a log file (appended to across restarts)."""

    port = None  # where it serves, for wait_listening()

    def __init__(self, name, argv, *, env, log_path, cwd=REPO_ROOT):
        self.name = name
        self.argv = [str(a) for a in argv]
        self.env = env
        self.log_path = Path(log_path)
        self.cwd = cwd
        self.process = None

    def start(self):
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"=== {time.strftime('%H:%M:%S')} start: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.argv, cwd=self.cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, preexec_fn=self.before_exec,
            )
        return self

    def before_exec(self):
        """In the child, before exec."""
        _die_with_parent()

    @property
    def pid(self):
        return self.process.pid

    def running(self):
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout=10.0):
        """SIGTERM, then SIGKILL if it has not exited within `timeout` seconds."""
        if self.running():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self._note(f"stopped (exit status {self.process.returncode})")

    def kill(self):
        """SIGKILL: the process gets no chance to say goodbye."""
        if self.running():
            self.process.kill()
            self.process.wait()
            self._note("killed (SIGKILL)")

    def children(self):
        """The process's children now (for a prefork Celery worker: its pool processes)."""
        import psutil

        return psutil.Process(self.pid).children() if self.running() else []

    def kill_tree(self):
        """SIGKILL the process and everything under it (a worker with its pool and the
        commands they run), as a machine losing power would: nobody cleans up."""
        import psutil

        if not self.running():
            return
        descendants = psutil.Process(self.pid).children(recursive=True)
        # The parent first, so that it cannot start new children.
        self.process.kill()
        for child in descendants:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        self.process.wait()
        psutil.wait_procs(descendants, timeout=5)
        self._note(f"killed with its {len(descendants)} descendant(s) (SIGKILL)")

    def _note(self, text):
        with self.log_path.open("ab") as log:
            log.write(f"=== {time.strftime('%H:%M:%S')} {text}\n".encode())

    def log_text(self):
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines=80):
        return "\n".join(self.log_text().splitlines()[-lines:]) or "(nothing logged)"

    def wait_listening(self, timeout=30.0):
        """Until something accepts connections on the process's `port` (it must keep
        running meanwhile)."""
        def listening():
            self.check_running()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return True
            except OSError:
                return False

        wait_until(listening, timeout=timeout, what=f"{self.name} listens on {self.port}",
                   interval=0.1)
        return self

    def check_running(self):
        """Fail at once (with the log) when the process died, rather than at a later timeout."""
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"{self.name} exited with status {self.process.returncode}:\n"
                                 f"{self.log_tail()}")


class Postgres(Process):
    """A PostgreSQL server of a test's own (Debian's packages, as scripts/services.sh starts
    the suite's), on a free loopback port, its data in a temporary directory that stop()
    removes. Its own, so that stopping it leaves the suite's database alone."""

    def __init__(self, name, *, env, log_path):
        bindir = max(Path("/usr/lib/postgresql").glob("*/bin/postgres"),
                     key=lambda path: int(path.parent.parent.name)).parent
        self.port = free_port()
        # In /tmp, and owned by the postgres user where we are root (postgres refuses root).
        self.root = Path(tempfile.mkdtemp(prefix="clusterui-test-pg-", dir="/tmp"))
        self.root.chmod(0o755)
        self.data = self.root / "data"
        self.user = pwd.getpwnam("postgres") if os.getuid() == 0 else None
        if self.user is not None:
            os.chown(self.root, self.user.pw_uid, self.user.pw_gid)
        subprocess.run([bindir / "initdb", "-D", self.data, "-U", "postgres", "--auth=trust",
                        "--encoding=UTF8", "--no-locale", "--no-sync"],
                       preexec_fn=self._as_postgres_user, check=True, capture_output=True)
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(f"listen_addresses = '127.0.0.1'\nport = {self.port}\n"
                       f"unix_socket_directories = '{self.root}'\nfsync = off\n"
                       "full_page_writes = off\n")
        super().__init__(name, [bindir / "postgres", "-D", self.data], env=env,
                         log_path=log_path)

    def _as_postgres_user(self):
        if self.user is not None:
            os.setgid(self.user.pw_gid)
            os.setuid(self.user.pw_uid)

    def before_exec(self):
        self._as_postgres_user()
        _die_with_parent()  # after setuid(), which clears it

    def url(self, dbname="postgres"):
        return f"postgres://postgres@127.0.0.1:{self.port}/{dbname}"

    def connect(self, dbname="postgres"):
        import psycopg

        return psycopg.connect(self.url(dbname), autocommit=True, connect_timeout=2)

    def wait_ready(self, timeout=30.0):
        def ready():
            self.check_running()
            try:
                self.connect().close()
                return True
            except Exception:  # noqa: BLE001 - not accepting connections yet
                return False

        wait_until(ready, timeout=timeout, what=f"{self.name} accepts connections",
                   interval=0.1)
        return self

    def stop(self, timeout=10.0):
        """A fast shutdown (SIGINT): open transactions are rolled back and every connection
        is dropped, as in a restart."""
        if self.running():
            self.process.send_signal(signal.SIGINT)
            self.process.wait(timeout=timeout)
            self._note(f"stopped (exit status {self.process.returncode})")

    def remove(self):
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


class Daphne(Process):
    """`daphne clusterui.asgi:application` on 127.0.0.1:`port` (fixed, so it can come back on
    the same port after a stop)."""

    def __init__(self, name, *, env, log_path, port=None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__(
            name,
            [sys.executable, "-m", "daphne", "-e",
             f"tcp:port={self.port}:interface=127.0.0.1:backlog=4096",
             "clusterui.asgi:application"],
            env=env, log_path=log_path,
        )


    def get(self, path, token=None, timeout=10.0):
        """(status, body) of a GET to this server."""
        request = urllib.request.Request(self.url + path)
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")


class Uvicorn(Daphne):
    """`uvicorn clusterui.asgi:application` on 127.0.0.1:`port`: what the README routes the
    agents' bundle uploads to (it reads a body as the app asks for it)."""

    def __init__(self, name, *, env, log_path, port=None):
        super().__init__(name, env=env, log_path=log_path, port=port)
        self.argv = [sys.executable, "-m", "uvicorn", "--host", "127.0.0.1", "--port",
                     str(self.port), "--log-level", "warning", "clusterui.asgi:application"]


class AgentGateway(Daphne):
    """`manage.py agent_gateway` on 127.0.0.1:`port`: /ws/agent/ alone (gateway/server.py)."""

    def __init__(self, name, *, env, log_path, port=None):
        super().__init__(name, env=env, log_path=log_path, port=port)
        self.argv = [sys.executable, "manage.py", "agent_gateway", "--bind", "127.0.0.1",
                     "--port", str(self.port)]


class Agent(Process):
    """The real agent (`python -m agent --simulate`), with its own state dir."""

    def __init__(self, name, *, server_url, token, state_dir, log_path, env, inject=None,
                 extra_args=()):
        self.node_name = name
        self.state_dir = Path(state_dir)
        argv = [sys.executable, "-m", "agent", "--simulate", "--server", server_url,
                "--state-dir", self.state_dir, "--node-name", name, *extra_args]
        if inject:
            argv += ["--inject", inject]
        # The join token as production passes it: never on the command line.
        super().__init__(f"agent {name}", argv, env={**env, "CLUSTERUI_AGENT_TOKEN": token},
                         log_path=log_path)

    def connections_opened(self):
        """How many times the agent was welcomed, by its log. It logs a welcome a moment
        after the server stored the hello."""
        return self.log_text().count("connected to ws://")

    def outbox_ids(self):
        """The ids of the events in the agent's outbox (not yet acked)."""
        path = self.state_dir / AGENT_OUTBOX
        if not path.exists():
            return []
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            return [row[0] for row in db.execute("SELECT id FROM events ORDER BY seq")]
        finally:
            db.close()


class ProcessGroup:
    """The processes a test started, in `directory`; stop_all() stops them, newest first."""

    def __init__(self, directory, env):
        self.directory = Path(directory)
        self.env = env
        self.processes = []

    def _log(self, name):
        safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in name)
        return self.directory / f"{safe}.log"

    def _add(self, process):
        self.processes.append(process)
        return process

    def env_with(self, **overrides):
        return {**self.env, **{k: str(v) for k, v in overrides.items()}}

    def daphne(self, name="daphne", *, port=None, start=True, **env):
        server = self._add(Daphne(name, env=self.env_with(**env), log_path=self._log(name),
                                  port=port))
        if start:
            server.start().wait_listening()
        return server

    def uvicorn(self, name="uvicorn", **env):
        server = self._add(Uvicorn(name, env=self.env_with(**env), log_path=self._log(name)))
        server.start()
        server.wait_listening()
        return server

    def gateway(self, name="gateway", **env):
        server = self._add(AgentGateway(name, env=self.env_with(**env),
                                        log_path=self._log(name)))
        server.start().wait_listening()
        return server

    def publisher(self, name="publisher", **env):
        """`manage.py publisher`: the live publisher in a process of its own."""
        argv = [sys.executable, "manage.py", "publisher"]
        return self._add(Process(name, argv, env=self.env_with(**env),
                                 log_path=self._log(name))).start()

    def agent(self, name, server, *, token, inject=None, state_dir=None, extra_args=()):
        """The agent of node `name`, connecting to `server` (anything with an http:// url)."""
        agent = Agent(name, server_url=agent_url(server.url), token=token,
                      state_dir=state_dir or self.directory / f"state-{name}",
                      log_path=self._log(f"agent-{name}"), env=self.env, inject=inject,
                      extra_args=extra_args)
        return self._add(agent).start()

    def celery(self, role, *extra, name=None, **env):
        """`celery -A clusterui worker|beat` with the test environment; `name` tells two of
        one role apart (and their logs)."""
        argv = [sys.executable, "-m", "celery", "-A", "clusterui", role, "--loglevel=INFO",
                *extra]
        name = name or f"celery-{role}"
        return self._add(Process(name, argv, env=self.env_with(**env),
                                 log_path=self._log(name))).start()

    def stop_all(self):
        for process in reversed(self.processes):
            try:
                process.stop()
            except Exception as exc:  # keep stopping the others
                print(f"stopping {process.name} failed: {exc!r}")

    def report(self):
        for process in self.processes:
            print(f"\n----- {process.name}: {process.log_path} (tail) -----\n"
                  f"{process.log_tail()}")


def agent_url(http_url):
    """The agent endpoint of the server at `http_url`."""
    return "ws" + http_url.removeprefix("http") + "/ws/agent/"


# An agent's WebSocket upgrade, raw, with a token that does not work: the server upgrades it,
# then closes it with 4401 (PROTOCOL.md).
AGENT_UPGRADE_WITH_A_BAD_TOKEN = (
    b"GET /ws/agent/ HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
    b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    b"Sec-WebSocket-Version: 13\r\nAuthorization: Bearer not-a-token\r\n\r\n")


def parse_metrics(text):
    """Prometheus text: [(name, {label: value}, float value)] (our own output's subset)."""
    series = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, label_text = head.partition("{")
        labels = {}
        for pair in label_text.rstrip("}").split('",'):
            if "=" in pair:
                key, _, raw = pair.partition("=")
                labels[key] = raw.strip('"')
        series.append((name, labels, float(value)))
    return series


def read_live_entries(redis_url, cluster_id):
    """The live store's entries for a cluster, straight from Redis: {node_id: entry}."""
    import redis

    from nodes.live_store import LIVE_KEY

    with redis.Redis.from_url(redis_url) as client:
        raw = client.hgetall(LIVE_KEY.format(cluster_id=cluster_id))
    return {int(k): json.loads(v) for k, v in raw.items()}


def redis_url_with_db(url, db):
    """The same Redis server, another database number."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{db}"))

