"""Fixtures the node hygiene tests share: a throwaway user, a Python it may run, and the
processes a test started, all ended at its end."""

import pwd
import signal
import subprocess
import sys
import time
import uuid

import pytest

from agent.hygiene.processes import process_pids, read_process, send_signal


@pytest.fixture(scope="module")
def test_user():
    """A throwaway user (uid >= 1000, no home); its processes are killed and it is
    removed afterwards. Skipped where users cannot be made (not root, no useradd)."""
    name = f"cuitest{uuid.uuid4().hex[:8]}"
    try:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                       check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot make a test user: {exc}")
    entry = pwd.getpwnam(name)
    yield entry
    for pid in process_pids():
        info = read_process(pid)
        if info is not None and info["uid"] == entry.pw_uid:
            send_signal(info, signal.SIGKILL)
    for _ in range(50):
        if subprocess.run(["userdel", name], capture_output=True).returncode == 0:
            break
        time.sleep(0.1)  # "user is currently used by process": its last ones are going


@pytest.fixture(scope="module")
def python(test_user):
    """A Python the test user may run (this venv's may sit under root's home)."""
    for candidate in (sys.executable, "/usr/bin/python3"):
        try:
            result = subprocess.run([candidate, "-c", "pass"], user=test_user.pw_uid,
                                    group=test_user.pw_gid, extra_groups=[],
                                    capture_output=True, timeout=30)
        except OSError:
            continue
        if result.returncode == 0:
            return candidate
    pytest.skip("no Python the test user can run")


class Started:
    """The processes a test started, all killed (and reaped) at its end."""

    def __init__(self):
        self.children = []  # Popen objects
        self.detached = []  # read_process() entries of processes left to init

    def close(self):
        for entry in self.detached:
            send_signal(entry, signal.SIGKILL)
        for child in self.children:
            child.kill()
            child.wait()


@pytest.fixture
def started():
    tracker = Started()
    yield tracker
    tracker.close()
