"""Providers: what reprovisions, fails over or removes a machine.

    provider.run(action, node_name, join_token=None) -> output
                                                    action: reprovision, failover, remove

run() starts the action and returns (a command with a time limit, or an API call); the
repair then waits for the node to come back (a hello with a new boot id). A failure raises
schedulers.ExecutorError with what an operator needs to act on. `SimulatedProvider` serves
the demo; `CommandProvider` runs the shell commands an admin configured (IPMI, MAAS, a
cloud CLI) with a time limit."""

import os
import shlex
import signal
import string
import subprocess
import tempfile

from django.core.exceptions import ValidationError

from clusters.secret_store import SecretsUnavailable, masked, values_referenced_in
from schedulers import ExecutorError

ACTIONS = ("reprovision", "failover", "remove")
PLACEHOLDERS = ("node", "hostname", "cluster", "action", "join_token")
JOIN_TOKEN_SHOWN = "<join token>"  # what output and errors show in its place
OUTPUT_TAIL_BYTES = 4096


class SimulatedProvider:
    """The demo's provider. Reprovision and failover hand back a fresh machine: the node's
    agent is asked to reboot (through `reboot_node(node_name)`), so it says hello again with
    a new boot id, which is what the repair waits for. Remove takes the node out of the pool
    and needs no reboot. Every call is kept in `calls` as (action, node_name).

    `reboot_node` is the console's way to send the agent its reboot command; it raises
    ExecutorError when it cannot (the node is not connected), and that error is the step's."""

    name = "simulated"

    def __init__(self, reboot_node):
        self.reboot_node = reboot_node
        self.calls = []

    def run(self, action, node_name, join_token=None):
        if action not in ACTIONS:
            raise ExecutorError(f"unknown provider action {action!r}")
        self.calls.append((action, node_name))
        if action == "remove":
            return f"simulated: {node_name} removed from the pool"
        self.reboot_node(node_name)
        if action == "reprovision":
            return f"simulated: {node_name} reprovisioned with a clean image; rebooting"
        return f"simulated: {node_name}'s workload moved to a fresh machine; rebooting"


class CommandProvider:
    """Runs the admin's command for an action, e.g.
    {"reprovision": "maas admin machine deploy {hostname}", "remove": "..."}.

    Placeholders: {node} (the node's name in clusterui), {hostname} (from `hostname_of`,
    the node's name when none is given), {cluster}, {action}, and {join_token}: for a
    reprovision or failover, a fresh single-use join token that re-joins only this node
    while the repair runs (for the new machine's agent: an image needs no long-lived token;
    empty for remove). Every substituted value is shell-quoted, so a node name cannot
    inject commands. The output and errors show the command with "<join token>" in the
    token's place, and the token is masked in what the command printed. A secret of the
    secrets store (clusters/secret_store.py) the command names as $NAME is in its environment,
    not its text, and masked in its output too. The command runs under /bin/sh in
    its own process group with stdin closed; at `timeout_s` the whole group is killed.
    stdout and stderr are kept together, their last 4 KiB in the output and in errors."""

    name = "command"

    def __init__(self, commands, timeout_s, cluster="", hostname_of=None):
        self.commands = dict(commands)
        self.timeout_s = timeout_s
        self.cluster = cluster
        self.hostname_of = hostname_of or (lambda node_name: node_name)

    def run(self, action, node_name, join_token=None):
        template = self.commands.get(action, "")
        if not template.strip():
            raise ExecutorError(f"no command configured for {action}")
        try:
            validate_command_template(template)
        except ValidationError as error:
            raise ExecutorError(f"the {action} command is not valid: {error.messages[0]}")
        values = {"node": node_name, "hostname": self.hostname_of(node_name),
                  "cluster": self.cluster, "action": action}
        command = template.format(**{name: shlex.quote(value) for name, value in values.items()},
                                  join_token=shlex.quote(join_token or ""))
        shown = template.format(**{name: shlex.quote(value) for name, value in values.items()},
                                join_token=JOIN_TOKEN_SHOWN)
        try:
            secrets = values_referenced_in(template)
        except SecretsUnavailable as error:
            raise ExecutorError(f"the {action} command's secrets: {error}")
        returncode, output = run_command(command, self.timeout_s, environment=secrets)
        output = masked(output, secrets)
        if join_token:
            output = output.replace(join_token, JOIN_TOKEN_SHOWN)
        if returncode is None:
            raise ExecutorError(
                f"$ {shown}\ntimed out after {self.timeout_s} s (killed)\n{output}"
            )
        if returncode != 0:
            raise ExecutorError(f"$ {shown}\n{describe_exit(returncode)}\n{output}")
        return f"$ {shown}\n{output}"


def run_command(command, timeout_s, environment=None):
    """Runs `command` under /bin/sh; returns (exit status, or None after a timeout; the last
    4 KiB of its output). The output goes to a temporary file rather than a pipe: a child
    that outlives the shell cannot hold us waiting on the pipe, and a chatty command
    costs disk rather than memory."""
    with tempfile.TemporaryFile() as output_file:
        process = subprocess.Popen(
            ["/bin/sh", "-c", command],
            stdin=subprocess.DEVNULL,
            stdout=output_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(environment or {})},
        )
        try:
            returncode = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            returncode = None
        size = output_file.seek(0, os.SEEK_END)
        output_file.seek(max(0, size - OUTPUT_TAIL_BYTES))
        output = output_file.read().decode("utf-8", errors="replace")
    return returncode, output


def describe_exit(returncode):
    if returncode < 0:
        return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


def validate_command_template(text):
    """For the settings form: refuses an empty command, unknown placeholders, and
    placeholders with a conversion or format spec (each value is inserted shell-quoted,
    as it is). Literal braces are written doubled: awk '{{print $1}}'."""
    if not text or not text.strip():
        raise ValidationError("Enter a command.")
    try:
        fields = list(string.Formatter().parse(text))
    except ValueError as error:
        raise ValidationError(
            f"Unbalanced braces ({error}); write a literal brace as {{{{ or }}}}."
        )
    allowed = ", ".join("{" + name + "}" for name in PLACEHOLDERS)
    for _literal, field_name, format_spec, conversion in fields:
        if field_name is None:
            continue
        if field_name not in PLACEHOLDERS:
            raise ValidationError(
                f"Unknown placeholder {{{field_name}}}; the placeholders are {allowed}."
            )
        if format_spec or conversion:
            raise ValidationError(
                f"Write the placeholder as {{{field_name}}}, without a conversion or format spec."
            )
