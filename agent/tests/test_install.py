"""`clusterui-agent install` (agent/install.py): the files it writes under --root."""

import os
import stat

import pytest

from agent.cli import main
from agent.config import build_config, read_config_file
from agent.install import install


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_it_writes_the_token_config_and_unit_under_the_root(tmp_path, capsys):
    ca = tmp_path / "console-ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    token_file = tmp_path / "join-token"
    token_file.write_text("cj_join_token\n")
    root = tmp_path / "root"

    status = main(["install", "--server", "wss://console.example.com/ws/agent/",
                   "--ca-file", str(ca), "--token-file", str(token_file), "--root", str(root)])

    assert status == 0
    etc = root / "etc/clusterui-agent"
    assert (etc / "join-token").read_text() == "cj_join_token\n"
    assert mode(etc / "join-token") == 0o600 and mode(etc / "agent.toml") == 0o600
    assert (etc / "ca.pem").read_text() == ca.read_text()
    values = read_config_file(str(etc / "agent.toml"))
    assert values == {"server": "wss://console.example.com/ws/agent/",
                      "token_file": "/etc/clusterui-agent/join-token",
                      "state_dir": "/var/lib/clusterui-agent",
                      "ca_file": "/etc/clusterui-agent/ca.pem"}
    build_config({}, {**values, "token_file": str(etc / "join-token")})  # the agent takes it
    unit = (root / "etc/systemd/system/clusterui-agent.service").read_text()
    assert "ExecStart=" in unit and "python -m agent" not in unit
    (exec_start,) = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert exec_start.endswith("/clusterui-agent --config /etc/clusterui-agent/agent.toml")
    assert "wrote" in capsys.readouterr().out


def test_the_token_comes_from_the_environment_and_never_the_command_line(
        tmp_path, monkeypatch, capsys):
    root = tmp_path / "root"
    with pytest.raises(SystemExit) as exit_:
        main(["install", "--server", "wss://c.example/ws/agent/", "--token", "cj_x",
              "--root", str(root)])
    assert exit_.value.code == 2
    assert "readable by every local user" in capsys.readouterr().err
    assert not root.exists()

    monkeypatch.setenv("CLUSTERUI_AGENT_TOKEN", "cj_from_env")
    assert main(["install", "--server", "wss://c.example/ws/agent/", "--root", str(root)]) == 0
    assert (root / "etc/clusterui-agent/join-token").read_text() == "cj_from_env\n"


def test_an_upgrade_keeps_the_token_and_a_first_install_needs_one(tmp_path, capsys):
    root = tmp_path / "root"
    assert main(["install", "--server", "wss://c.example/ws/agent/", "--root", str(root)]) == 2
    assert "no join token" in capsys.readouterr().err

    install("wss://c.example/ws/agent/", token="cj_first", root=str(root))
    install("wss://c.example/ws/agent/", token=None, root=str(root))  # upgrade: none given
    assert (root / "etc/clusterui-agent/join-token").read_text() == "cj_first\n"


def test_a_plaintext_server_elsewhere_is_refused(tmp_path, capsys):
    status = main(["install", "--server", "ws://console.example.com/ws/agent/",
                   "--root", str(tmp_path)])
    assert status == 2
    assert "plaintext" in capsys.readouterr().err
