"""The command that installs the agent on a node: shown on the cluster's page, pasted on a
node as root (or run in an image build or cloud-init).

It verifies what it fetches as root: every wheel's sha256 is pinned in the command itself
(pip --require-hashes, from the wheelhouse's manifest), and the console's certificate is
checked against the CA the command carries (CLUSTERUI_AGENT_CA_FILE), or the node's system
CAs. It installs the wheels from the console's /agent/wheels/ alone (pip --no-index
--isolated: no package index, no pip configuration of the node), into
/opt/clusterui-agent/venv, then `clusterui-agent install` writes the config, the join
token and the systemd unit and starts the agent (agent/install.py).

The join token comes from /etc/clusterui-agent/join-token (or the file
CLUSTERUI_AGENT_TOKEN_FILE names) or the environment (CLUSTERUI_AGENT_TOKEN): never the
command line, where every local user reads it. CLUSTERUI_AGENT_ROOT installs under another
root and starts nothing.
"""

from urllib.parse import urlsplit

from django.conf import settings

from .wheelhouse import WheelhouseError, pinned_requirements, read_manifest


def agent_socket_url(console_url):
    """wss://<console>/ws/agent/ (ws:// for an http:// console: the embedded demo)."""
    parts = urlsplit(console_url)
    scheme = "wss" if parts.scheme == "https" else "ws"
    return f"{scheme}://{parts.netloc}/ws/agent/"


def install_command(manifest, console_url, ca_pem=""):
    """The install command for the wheelhouse of `manifest`, served at `console_url`
    (https://console.example.com/). Raises WheelhouseError when the wheelhouse lacks a wheel."""
    parts = urlsplit(console_url)
    wheels_url = f"{parts.scheme}://{parts.netloc}/agent/wheels/"
    requirements = "\n".join(pinned_requirements(manifest))
    pip_options = ["--quiet", "--isolated", "--no-index", "--require-hashes",
                   f"--find-links {wheels_url}"]
    agent_options = [f"--server {agent_socket_url(console_url)}"]
    ca_lines = []
    if ca_pem:
        ca_lines = ["cat > \"$ETC/ca.pem\" <<'CLUSTERUI_CA'", ca_pem.strip(), "CLUSTERUI_CA"]
        pip_options.append('--cert "$ETC/ca.pem"')
        agent_options.append('--ca-file "$ETC/ca.pem"')
    if parts.scheme == "http":  # pip reads an http:// find-links only from a host it trusts
        pip_options.append(f"--trusted-host {parts.hostname}")
    return "\n".join([
        f"# clusterui-agent {manifest['agent_version']}: run as root. The join token: "
        "/etc/clusterui-agent/join-token (mode 600) or CLUSTERUI_AGENT_TOKEN.",
        "sh -eu <<'CLUSTERUI_INSTALL'",
        'ROOT="${CLUSTERUI_AGENT_ROOT:-}"',
        'ETC="$ROOT/etc/clusterui-agent"',
        'VENV="$ROOT/opt/clusterui-agent/venv"',
        'TOKEN_FILE="${CLUSTERUI_AGENT_TOKEN_FILE:-$ETC/join-token}"',
        "umask 077",
        'mkdir -p "$ETC"',
        *ca_lines,
        "cat > \"$ETC/requirements.txt\" <<'CLUSTERUI_WHEELS'",
        requirements,
        "CLUSTERUI_WHEELS",
        'python3 -m venv "$VENV"',
        f'"$VENV/bin/pip" install {" ".join(pip_options)} -r "$ETC/requirements.txt"',
        'set --',
        '[ -f "$TOKEN_FILE" ] && set -- --token-file "$TOKEN_FILE"',
        f'"$VENV/bin/clusterui-agent" install {" ".join(agent_options)} --root "${{ROOT:-/}}" "$@"',
        "CLUSTERUI_INSTALL",
    ])


def install_panel(console_url):
    """What the cluster's page shows of the install: {"command", "version"}, or {"problem"}
    when the wheelhouse is not built or lacks a wheel."""
    manifest = read_manifest()
    if manifest is None:
        return {"problem": "No agent wheelhouse is built on this console: run "
                           "`manage.py build_agent_wheelhouse` where a package index is "
                           "reachable (the README's install steps do)."}
    ca_pem = ""
    if settings.CLUSTERUI_AGENT_CA_FILE:
        with open(settings.CLUSTERUI_AGENT_CA_FILE) as f:
            ca_pem = f.read()
    try:
        command = install_command(manifest, console_url, ca_pem)
    except WheelhouseError as exc:
        return {"problem": str(exc)}
    return {"command": command, "version": manifest["agent_version"], "ca": bool(ca_pem),
            "targets": manifest["targets"]}
