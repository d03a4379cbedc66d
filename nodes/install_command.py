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

import json
import textwrap
from urllib.parse import urlsplit

from django.conf import settings

from .wheelhouse import WheelhouseError, pinned_requirements, read_manifest


def agent_socket_url(console_url):
    """wss://<console>/ws/agent/ (ws:// for an http:// console: the embedded demo)."""
    parts = urlsplit(console_url)
    scheme = "wss" if parts.scheme == "https" else "ws"
    return f"{scheme}://{parts.netloc}/ws/agent/"


def wheels_url(console_url):
    parts = urlsplit(console_url)
    return f"{parts.scheme}://{parts.netloc}/agent/wheels/"


def pip_install_options(console_url, ca_path=None):
    """pip's options for installing from the console's wheelhouse alone, every hash pinned."""
    options = ["--quiet", "--isolated", "--no-index", "--require-hashes",
               f"--find-links {wheels_url(console_url)}"]
    if ca_path:
        options.append(f"--cert {ca_path}")
    parts = urlsplit(console_url)
    if parts.scheme == "http":  # pip reads an http:// find-links only from a host it trusts
        options.append(f"--trusted-host {parts.hostname}")
    return " ".join(options)


def install_command(manifest, console_url, ca_pem=""):
    """The install command for the wheelhouse of `manifest`, served at `console_url`
    (https://console.example.com/). Raises WheelhouseError when the wheelhouse lacks a wheel."""
    requirements = "\n".join(pinned_requirements(manifest))
    agent_options = [f"--server {agent_socket_url(console_url)}"]
    ca_lines = []
    if ca_pem:
        ca_lines = ["cat > \"$ETC/ca.pem\" <<'CLUSTERUI_CA'", ca_pem.strip(), "CLUSTERUI_CA"]
        agent_options.append('--ca-file "$ETC/ca.pem"')
    pip_options = pip_install_options(console_url, '"$ETC/ca.pem"' if ca_pem else None)
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
        f'"$VENV/bin/pip" install {pip_options} -r "$ETC/requirements.txt"',
        'set --',
        '[ -f "$TOKEN_FILE" ] && set -- --token-file "$TOKEN_FILE"',
        f'"$VENV/bin/clusterui-agent" install {" ".join(agent_options)} --root "${{ROOT:-/}}" "$@"',
        "CLUSTERUI_INSTALL",
    ])


# The DaemonSet's image: a stock Python whose initContainer installs the agent from the
# console (no image of ours to build or pull), 3.12 for which the wheelhouse has wheels.
DAEMONSET_IMAGE = "python:3.12-slim"
DAEMONSET_NAMESPACE = "clusterui-agent"
JOIN_TOKEN_SECRET = "clusterui-agent-join-token"
# In a container with the host's PID namespace (hostPID) and privileges: the host's reboot.
HOST_REBOOT = "nsenter --target 1 --mount --uts --ipc --net --pid -- systemctl reboot"


def daemonset_manifest(manifest, console_url, cluster_slug, ca_pem=""):
    """A Kubernetes cluster's agent as a DaemonSet (YAML, several documents): the namespace,
    a ConfigMap with the hash-pinned requirements, the agent's config (and the console's
    CA), and the DaemonSet on every GPU node. The join token comes from the Secret
    JOIN_TOKEN_SECRET, made beforehand (the file's first lines say how)."""
    config = "\n".join(filter(None, [
        f'server = "{agent_socket_url(console_url)}"',
        'state_dir = "/var/lib/clusterui-agent"',
        'kmsg = "/dev/kmsg"',
        f'reboot_command = "{HOST_REBOOT}"',
        'ca_file = "/etc/clusterui-agent/ca.pem"' if ca_pem else "",
    ]))
    data = {"requirements.txt": "\n".join(pinned_requirements(manifest)), "agent.toml": config}
    if ca_pem:
        data["ca.pem"] = ca_pem.strip()
    config_map = "\n".join(f"  {name}: |\n{textwrap.indent(text, '    ')}"
                           for name, text in data.items())
    pip = (f"pip install {pip_install_options(console_url, '/etc/clusterui-agent/ca.pem' if ca_pem else None)}"
           " --target /opt/clusterui-agent -r /etc/clusterui-agent/requirements.txt")
    return DAEMONSET_YAML.format(
        version=manifest["agent_version"], cluster=cluster_slug, namespace=DAEMONSET_NAMESPACE,
        secret=JOIN_TOKEN_SECRET, config_map=config_map, image=DAEMONSET_IMAGE,
        pip=json.dumps(pip))


DAEMONSET_YAML = """\
# clusterui-agent {version} for the cluster {cluster}, on every GPU node. First the join
# token, from a file (never the command line):
#   kubectl create namespace {namespace}
#   kubectl -n {namespace} create secret generic {secret} --from-file=token=./join-token
# then: kubectl apply -f this file. Upgrades: download it again after the console's.
apiVersion: v1
kind: Namespace
metadata:
  name: {namespace}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: clusterui-agent
  namespace: {namespace}
data:
{config_map}
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: clusterui-agent
  namespace: {namespace}
  labels:
    app.kubernetes.io/name: clusterui-agent
    app.kubernetes.io/version: "{version}"
spec:
  selector:
    matchLabels:
      app.kubernetes.io/name: clusterui-agent
  updateStrategy:
    type: RollingUpdate
    rollingUpdate:
      maxUnavailable: 10%
  template:
    metadata:
      labels:
        app.kubernetes.io/name: clusterui-agent
    spec:
      hostPID: true
      runtimeClassName: nvidia
      priorityClassName: system-node-critical
      nodeSelector:
        nvidia.com/gpu.present: "true"
      tolerations:
        - operator: Exists
      initContainers:
        - name: install
          image: {image}
          command: ["sh", "-eu", "-c", {pip}]
          volumeMounts:
            - name: agent
              mountPath: /opt/clusterui-agent
            - name: config
              mountPath: /etc/clusterui-agent
              readOnly: true
      containers:
        - name: agent
          image: {image}
          command: ["python", "-m", "agent", "--config", "/etc/clusterui-agent/agent.toml",
                    "--node-name", "$(NODE_NAME)"]
          env:
            - name: PYTHONPATH
              value: /opt/clusterui-agent
            - name: NODE_NAME
              valueFrom:
                fieldRef:
                  fieldPath: spec.nodeName
            - name: CLUSTERUI_AGENT_TOKEN
              valueFrom:
                secretKeyRef:
                  name: {secret}
                  key: token
            - name: NVIDIA_VISIBLE_DEVICES
              value: all
            - name: NVIDIA_DRIVER_CAPABILITIES
              value: utility,compute
          securityContext:
            privileged: true
          resources:
            requests:
              cpu: 50m
              memory: 128Mi
            limits:
              memory: 512Mi
          volumeMounts:
            - name: agent
              mountPath: /opt/clusterui-agent
              readOnly: true
            - name: config
              mountPath: /etc/clusterui-agent
              readOnly: true
            - name: state
              mountPath: /var/lib/clusterui-agent
            - name: kmsg
              mountPath: /dev/kmsg
              readOnly: true
      volumes:
        - name: agent
          emptyDir: {{}}
        - name: config
          configMap:
            name: clusterui-agent
        - name: state
          hostPath:
            path: /var/lib/clusterui-agent
            type: DirectoryOrCreate
        - name: kmsg
          hostPath:
            path: /dev/kmsg
            type: CharDevice
"""


def console_ca_pem():
    """The CA certificates nodes check the console against (CLUSTERUI_AGENT_CA_FILE), or ""."""
    if not settings.CLUSTERUI_AGENT_CA_FILE:
        return ""
    with open(settings.CLUSTERUI_AGENT_CA_FILE) as f:
        return f.read()


def install_panel(console_url):
    """What the cluster's page shows of the install: {"command", "version"}, or {"problem"}
    when the wheelhouse is not built or lacks a wheel."""
    manifest = read_manifest()
    if manifest is None:
        return {"problem": "No agent wheelhouse is built on this console: run "
                           "`manage.py build_agent_wheelhouse` where a package index is "
                           "reachable (the README's install steps do)."}
    ca_pem = console_ca_pem()
    try:
        command = install_command(manifest, console_url, ca_pem)
    except WheelhouseError as exc:
        return {"problem": str(exc)}
    return {"command": command, "version": manifest["agent_version"], "ca": bool(ca_pem),
            "targets": manifest["targets"]}
