"""Issue 15, points 3 and 4, the agent's side: a token never on the command line (a file or
the environment), no plaintext to another machine without --insecure, and wss:// with the
server's certificate verified (against --ca-file for a private PKI)."""

import asyncio
import ssl

import pytest

from agent import cli
from agent.config import (
    ConfigError,
    build_config,
    check_server,
    read_join_token,
    tls_context,
)
from agent.tests.fake_server import FakeServer, until
from agent.tests.test_client import make_client, running
from agent.tests.tls import make_pki

SERVER = "wss://clusterui.example.com/ws/agent/"


def test_a_token_on_the_command_line_is_refused(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["--server", SERVER, "--token", "cuj_secret", "--print-once", "--simulate"])
    assert exited.value.code == 2
    assert "readable by every local user (ps)" in capsys.readouterr().err


def test_the_fleet_refuses_a_token_on_the_command_line_too(capsys):
    from agent.sim import fleet

    with pytest.raises(SystemExit):
        fleet.main(["--server", "ws://127.0.0.1:1/ws/agent/", "--state-dir", "/tmp/x",
                    "--count", "1", "--token", "cuj_secret"])
    assert "readable by every local user" in capsys.readouterr().err


def test_the_join_token_comes_from_a_file_then_the_config_then_the_environment(tmp_path):
    token_file = tmp_path / "join-token"
    token_file.write_text("cuj_from_file\n")
    environ = {"CLUSTERUI_AGENT_TOKEN": "cuj_from_env"}
    assert read_join_token(str(token_file), "cuj_in_config", environ) == "cuj_from_file"
    assert read_join_token(None, "cuj_in_config", environ) == "cuj_in_config"
    assert read_join_token(None, None, environ) == "cuj_from_env"
    assert read_join_token(None, None, {}) is None
    config = build_config({"server": SERVER, "node_name": "gpu-1",
                           "token_file": str(token_file)})
    assert config.token == "cuj_from_file"


@pytest.mark.parametrize("content, words", [(None, "cannot read the token file"),
                                            ("\n", "is empty")])
def test_a_token_file_that_gives_no_token_is_a_clear_error(tmp_path, content, words):
    path = tmp_path / "join-token"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=words):
        read_join_token(str(path))


@pytest.mark.parametrize("url", ["ws://10.0.0.5/ws/agent/", "ws://console.example.com/ws/agent/",
                                 "ws://127.0.0.1.example.com/ws/agent/"])
def test_plaintext_to_another_machine_needs_insecure(url):
    with pytest.raises(ConfigError, match="plaintext"):
        check_server(url)
    check_server(url, insecure=True)
    with pytest.raises(ConfigError, match="plaintext"):
        build_config({"server": url, "node_name": "gpu-1"})
    assert build_config({"server": url, "node_name": "gpu-1", "insecure": True}).insecure


@pytest.mark.parametrize("url", ["ws://127.0.0.1:8000/ws/agent/", "ws://localhost/ws/agent/",
                                 "ws://[::1]:8000/ws/agent/", "ws://127.8.9.1/ws/agent/", SERVER])
def test_loopback_and_wss_need_nothing(url):
    check_server(url)


def test_a_ca_file_is_for_wss_and_must_be_readable(tmp_path):
    with pytest.raises(ConfigError, match="applies to a wss:// server only"):
        build_config({"server": "ws://127.0.0.1/ws/agent/", "node_name": "gpu-1",
                      "ca_file": "/etc/ca.pem"})
    with pytest.raises(ConfigError, match="cannot read the CA file"):
        tls_context(SERVER, str(tmp_path / "missing.pem"))
    assert tls_context("ws://127.0.0.1/ws/agent/", None) is None
    context = tls_context(SERVER, None)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname


def connect_over_tls(server_tls, state_dir, client_tls):
    """(welcomed within 3 s, the Authorization headers the server saw)."""
    async def scenario():
        async with FakeServer(tls=server_tls) as server:
            client = make_client(server, state_dir, tls=client_tls)
            async with running(client):
                try:
                    await until(lambda: server.connections and server.connections[0].welcomed,
                                timeout_s=3)
                except TimeoutError:
                    return False, server.attempts
                return True, server.attempts

    state_dir.mkdir()
    return asyncio.run(scenario())


def test_wss_verifies_the_servers_certificate_against_the_ca_file(tmp_path):
    ca_file, server_tls = make_pki(tmp_path)
    welcomed, _ = connect_over_tls(server_tls, tmp_path / "trusting",
                                   tls_context(SERVER, str(ca_file)))
    assert welcomed
    # The system's CAs do not know the private one: no connection, and the token never sent.
    welcomed, attempts = connect_over_tls(server_tls, tmp_path / "default",
                                          tls_context(SERVER, None))
    assert not welcomed and attempts == []
