"""The providers: the simulated one asks its node to reboot for reprovision and failover; the
command one runs real subprocesses with quoting, a time limit and captured output."""

import time

import pytest
from cryptography.fernet import Fernet
from django.core.exceptions import ValidationError

from clusters.secret_store import do_set_secret
from schedulers import ExecutorError
from repairs.providers import (
    CommandProvider,
    SimulatedProvider,
    validate_command_template,
)


class RebootRecorder:
    def __init__(self):
        self.node_names = []

    def __call__(self, node_name):
        self.node_names.append(node_name)


@pytest.mark.parametrize("action", ["reprovision", "failover"])
def test_simulated_reprovision_and_failover_reboot_the_node(action):
    reboot = RebootRecorder()
    provider = SimulatedProvider(reboot_node=reboot)

    output = provider.run(action, "gpu-017")

    assert reboot.node_names == ["gpu-017"]
    assert provider.calls == [(action, "gpu-017")]
    assert "gpu-017" in output and "rebooting" in output


def test_simulated_remove_takes_the_node_out_without_a_reboot():
    reboot = RebootRecorder()
    provider = SimulatedProvider(reboot_node=reboot)

    output = provider.run("remove", "gpu-017")

    assert reboot.node_names == []
    assert provider.calls == [("remove", "gpu-017")]
    assert output == "simulated: gpu-017 removed from the pool"


def test_simulated_refuses_an_unknown_action():
    reboot = RebootRecorder()
    with pytest.raises(ExecutorError, match="unknown provider action 'reboot'"):
        SimulatedProvider(reboot_node=reboot).run("reboot", "gpu-017")
    assert reboot.node_names == []


def test_command_substitutes_every_placeholder():
    provider = CommandProvider(
        {"reprovision": "echo {action} {node} {hostname} {cluster}"},
        timeout_s=10,
        cluster="prod-h200",
        hostname_of=lambda node_name: f"{node_name}.example.net",
    )

    output = provider.run("reprovision", "gpu-017")

    assert output == (
        "$ echo reprovision gpu-017 gpu-017.example.net prod-h200\n"
        "reprovision gpu-017 gpu-017.example.net prod-h200\n"
    )


def test_command_hostname_defaults_to_the_node_name():
    provider = CommandProvider({"remove": "echo {hostname}"}, timeout_s=10)
    assert provider.run("remove", "gpu-017").endswith("\ngpu-017\n")


def test_command_quotes_a_node_name_with_shell_metacharacters(tmp_path):
    marker = tmp_path / "injected"
    node_name = f"gpu-1; touch {marker} $(touch {marker}) `touch {marker}` 'x\" *"
    provider = CommandProvider({"failover": "printf '%s\\n' {node}"}, timeout_s=10)

    output = provider.run("failover", node_name)

    assert not marker.exists()
    assert output.endswith(f"\n{node_name}\n")


def test_command_keeps_stderr_with_stdout():
    provider = CommandProvider({"remove": "echo out; echo err >&2"}, timeout_s=10)
    assert provider.run("remove", "gpu-017").endswith("\nout\nerr\n")


def test_command_non_zero_exit_raises_with_status_and_output():
    provider = CommandProvider({"reprovision": "echo ipmi: no answer from {node}; exit 3"}, 10)

    with pytest.raises(ExecutorError) as error:
        provider.run("reprovision", "gpu-017")

    assert str(error.value) == (
        "$ echo ipmi: no answer from gpu-017; exit 3\n"
        "exit status 3\n"
        "ipmi: no answer from gpu-017\n"
    )


def test_command_timeout_raises_with_the_output_so_far():
    # A 3 s limit leaves a slow machine time to start the shell and echo; 15 s is still
    # well short of the command's 30.
    provider = CommandProvider({"failover": "echo started; sleep 30; echo finished"}, timeout_s=3)

    started = time.monotonic()
    with pytest.raises(ExecutorError) as error:
        provider.run("failover", "gpu-017")
    elapsed = time.monotonic() - started

    assert elapsed < 15
    message = str(error.value)
    assert message.startswith(
        "$ echo started; sleep 30; echo finished\ntimed out after 3 s (killed)\n"
    )
    assert message.endswith("started\n")


def test_command_timeout_kills_the_shells_children_too(tmp_path):
    marker = tmp_path / "still-running"
    provider = CommandProvider({"failover": f"(sleep 2; touch {marker})"}, timeout_s=0.5)

    with pytest.raises(ExecutorError, match="timed out"):
        provider.run("failover", "gpu-017")
    time.sleep(2)

    assert not marker.exists()


def test_command_keeps_the_last_4_kib_of_output():
    provider = CommandProvider(
        {"remove": "head -c 10000 /dev/zero | tr '\\0' a; echo; echo the-end"}, timeout_s=10
    )

    output = provider.run("remove", "gpu-017")

    kept = output.split("\n", 1)[1]
    assert len(kept.encode()) == 4096
    assert kept.endswith("a\nthe-end\n")


def test_command_without_a_configured_action_raises():
    provider = CommandProvider({"remove": "true"}, timeout_s=10)
    with pytest.raises(ExecutorError, match="^no command configured for reprovision$"):
        provider.run("reprovision", "gpu-017")


def test_command_with_an_invalid_template_raises_instead_of_running(tmp_path):
    marker = tmp_path / "ran"
    provider = CommandProvider({"remove": f"touch {marker} {{nodename}}"}, timeout_s=10)
    with pytest.raises(ExecutorError, match="remove command is not valid: Unknown placeholder"):
        provider.run("remove", "gpu-017")
    assert not marker.exists()


@pytest.mark.parametrize(
    "text",
    [
        "ipmitool -H {hostname} chassis power cycle",
        "maas admin machine deploy {node} # {cluster} {action}",
        "awk '{{print $1}}' /etc/hosts",
        "true",
    ],
)
def test_validate_accepts_known_placeholders_and_doubled_braces(text):
    validate_command_template(text)


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "Enter a command."),
        ("   ", "Enter a command."),
        ("echo {ip}", "Unknown placeholder {ip}; the placeholders are {node}, {hostname}"),
        ("echo {}", "Unknown placeholder {}"),
        ("echo {node.name}", "Unknown placeholder {node.name}"),
        ("echo {node!r}", "without a conversion or format spec"),
        ("echo {node:>20}", "without a conversion or format spec"),
        ("awk '{print $1}'", "Unknown placeholder {print $1}"),
        ("echo {node", "Unbalanced braces"),
        ("echo }", "Unbalanced braces"),
    ],
)
def test_validate_refuses_empty_text_and_unknown_placeholders(text, message):
    with pytest.raises(ValidationError) as error:
        validate_command_template(text)
    assert message in error.value.messages[0]


@pytest.mark.django_db
def test_a_secret_the_command_names_is_in_its_environment_and_masked_in_its_output(
        tmp_path, settings, admin):
    settings.CLUSTERUI_SECRETS_KEYS = [Fernet.generate_key().decode()]
    do_set_secret("IPMI_PASSWORD", "pa55-w0rd", actor=admin)
    marker = tmp_path / "seen"
    provider = CommandProvider({"reprovision": f'printf %s "$IPMI_PASSWORD" > {marker}; '
                                               f'echo "logged in with $IPMI_PASSWORD"'}, 10)
    output = provider.run("reprovision", "gpu-001")
    assert marker.read_text() == "pa55-w0rd"  # the command had it
    assert "pa55-w0rd" not in output and "logged in with <secret IPMI_PASSWORD>" in output
    assert '"$IPMI_PASSWORD"' in output  # the command as written, not as run


@pytest.mark.django_db
def test_a_failing_command_masks_its_secrets_in_the_error(settings, admin):
    settings.CLUSTERUI_SECRETS_KEYS = [Fernet.generate_key().decode()]
    do_set_secret("API_KEY", "k-999", actor=admin)
    provider = CommandProvider({"remove": 'echo "bad key $API_KEY" >&2; exit 4'}, 10)
    with pytest.raises(ExecutorError) as failed:
        provider.run("remove", "gpu-001")
    assert "k-999" not in str(failed.value) and "<secret API_KEY>" in str(failed.value)
