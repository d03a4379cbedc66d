"""The servers that take the agents' connections listen with a backlog of 4,096 (README.md):
daphne as every deployment file starts it, and the agent gateway (gateway/server.py). With
Twisted's 50 (daphne's `-b`/`-p`), 300 connections opened at once took 2-5 s here, each
refused one retried by TCP a second later; with 4,096, 20 ms."""

import re
import subprocess
from pathlib import Path

import pytest

from gateway.server import LISTEN_BACKLOG

REPO = Path(__file__).resolve().parent.parent
# Where daphne is started for people and agents: production, the demo, and the tests' servers.
STARTS_DAPHNE = ("README.md", "deploy/systemd/clusterui-web@.service",
                 "deploy/kubernetes/clusterui.yaml", "deploy/kubernetes/Dockerfile",
                 "scripts/demo.sh", "tests/integration.py", "tests/browser.py")


def listen_backlog(port):
    """The backlog of the socket listening on 127.0.0.1:`port`: ss's Send-Q for a listener."""
    out = subprocess.run(["ss", "-H", "-l", "-t", "-n", f"sport = :{port}"],
                         capture_output=True, text=True, check=True).stdout
    rows = [line.split() for line in out.splitlines() if line.strip()]
    assert len(rows) == 1, out
    state, _accept_queue, backlog, *_ = rows[0]
    assert state == "LISTEN", out
    return int(backlog)


def test_each_daphne_the_project_starts_listens_with_that_backlog():
    for path in STARTS_DAPHNE:
        text = (REPO / path).read_text()
        assert "backlog=4096" in text, path
        # -b/-p: Twisted's backlog of 50
        assert not re.search(r"daphne\W+(-b|-p|--bind|--port)\b", text), path


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_daphne_and_the_agent_gateway_listen_with_a_backlog_of_4096(processes):
    assert LISTEN_BACKLOG == 4096
    daphne = processes.daphne()
    gateway = processes.gateway()

    # The kernel caps a backlog at net.core.somaxconn (4,096 by default since Linux 5.4).
    somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
    assert listen_backlog(daphne.port) == min(LISTEN_BACKLOG, somaxconn)
    assert listen_backlog(gateway.port) == min(LISTEN_BACKLOG, somaxconn)
