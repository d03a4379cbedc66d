"""`clusterui-agent install`: make this node run the installed agent as a systemd service.

The console's install command (the cluster's settings page) installs the agent's wheel into
/opt/clusterui-agent/venv, then runs this, as root, to write:

    /etc/clusterui-agent/join-token      the join token (mode 600), from --token-file or
                                         CLUSTERUI_AGENT_TOKEN: never the command line
    /etc/clusterui-agent/agent.toml      server, token_file, ca_file, state_dir (mode 600)
    /etc/systemd/system/clusterui-agent.service
                                         the packaged unit, its ExecStart this venv's
                                         clusterui-agent

and then `systemctl daemon-reload` and `systemctl enable --now` (a restart, when the agent
already runs: an upgrade). Run again, it rewrites the files: the join token is kept when
none is given. `--root DIR` writes under DIR instead of / and starts nothing (an image's
root, or a test).
"""

import argparse
import os
import shutil
import subprocess
import sys
from importlib import resources

from agent.config import TOKEN_ENVIRONMENT, TOKEN_ON_ARGV, ConfigError, check_server

CONFIG_DIR = "etc/clusterui-agent"
UNIT_PATH = "etc/systemd/system/clusterui-agent.service"
STATE_DIR = "/var/lib/clusterui-agent"
PACKAGED_EXEC_START = ("ExecStart=/opt/clusterui-agent/venv/bin/python -m agent "
                       "--config /etc/clusterui-agent/agent.toml")


def make_parser():
    parser = argparse.ArgumentParser(
        prog="clusterui-agent install",
        description="Write the agent's config, join token and systemd unit, and start it.")
    parser.add_argument("--server", required=True, help="wss://<console>/ws/agent/")
    parser.add_argument("--ca-file", help="the console's CA certificates (a private PKI); "
                                          "copied to /etc/clusterui-agent/ca.pem")
    parser.add_argument("--token-file", help="a file holding the join token (else "
                                             f"{TOKEN_ENVIRONMENT})")
    parser.add_argument("--token", help=argparse.SUPPRESS)
    parser.add_argument("--root", default="/", help="write under this directory and start "
                                                    "nothing (default /)")
    return parser


def toml_string(value):
    """A TOML basic string: a path or URL with its backslashes and quotes escaped."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_file(path, text, mode):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(descriptor, "w") as f:
        f.write(text)
    os.chmod(path, mode)  # O_CREAT's mode is not applied to a file that existed


def unit_text(executable):
    """The packaged unit, started by `executable` (this venv's clusterui-agent)."""
    text = resources.files("agent").joinpath("clusterui-agent.service").read_text()
    if PACKAGED_EXEC_START not in text:
        raise RuntimeError("the packaged unit's ExecStart changed: update agent/install.py")
    return text.replace(PACKAGED_EXEC_START,
                        f"ExecStart={executable} --config /etc/clusterui-agent/agent.toml")


def install(server, *, token, ca_file=None, root="/", executable=None):
    """Write the files under `root`; returns their paths. `token`: the join token, or None
    to keep the one a previous install wrote."""
    check_server(server)
    config_dir = os.path.join(root, CONFIG_DIR)
    token_path = os.path.join(config_dir, "join-token")
    if token is not None:
        write_file(token_path, token.strip() + "\n", 0o600)
    elif not os.path.exists(token_path):
        raise ConfigError(f"no join token: give --token-file FILE or {TOKEN_ENVIRONMENT}")
    lines = [f"server = {toml_string(server)}",
             f"token_file = {toml_string('/' + CONFIG_DIR + '/join-token')}",
             f"state_dir = {toml_string(STATE_DIR)}"]
    if ca_file:
        ca_path = os.path.join(config_dir, "ca.pem")
        if os.path.abspath(ca_file) != os.path.abspath(ca_path):
            os.makedirs(config_dir, exist_ok=True)
            shutil.copyfile(ca_file, ca_path)
        lines.append(f"ca_file = {toml_string('/' + CONFIG_DIR + '/ca.pem')}")
    config_path = os.path.join(config_dir, "agent.toml")
    write_file(config_path, "# Written by `clusterui-agent install`; see agent.example.toml "
                            "for the other keys.\n" + "\n".join(lines) + "\n", 0o600)
    executable = executable or os.path.join(os.path.dirname(sys.executable), "clusterui-agent")
    unit_path = os.path.join(root, UNIT_PATH)
    write_file(unit_path, unit_text(executable), 0o644)
    return token_path, config_path, unit_path


def main(argv):
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.token is not None:
        parser.error(f"--token: {TOKEN_ON_ARGV}")
    try:
        token = None
        if args.token_file:
            with open(args.token_file) as f:
                token = f.read().strip()
            if not token:
                raise ConfigError(f"the token file {args.token_file} is empty")
        elif os.environ.get(TOKEN_ENVIRONMENT):
            token = os.environ[TOKEN_ENVIRONMENT]
        written = install(args.server, token=token, ca_file=args.ca_file, root=args.root)
    except (ConfigError, OSError) as exc:
        print(f"clusterui-agent install: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    if os.path.abspath(args.root) != "/":
        return 0
    for command in (["systemctl", "daemon-reload"],
                    ["systemctl", "enable", "clusterui-agent"],
                    ["systemctl", "restart", "clusterui-agent"]):
        if subprocess.run(command).returncode != 0:
            print(f"clusterui-agent install: {' '.join(command)} failed", file=sys.stderr)
            return 1
    print("clusterui-agent is running: journalctl -u clusterui-agent -f")
    return 0
