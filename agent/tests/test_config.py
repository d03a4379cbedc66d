import pytest

from agent import cli, host
from agent.config import (
    Config,
    ConfigError,
    Fault,
    HygieneConfig,
    build_config,
    read_config_file,
)

SERVER = "wss://clusterui.example.com/ws/agent/"


def options(**given):
    """The command line's values, as cli.main passes them: None where not given."""
    names = (
        "server",
        "token",
        "state_dir",
        "node_name",
        "sample_interval",
        "throttle_hold",
        "kmsg",
        "simulate",
        "gpus",
        "inject",
        "print_once",
        "verbose",
    )
    values = dict.fromkeys(names)
    values.update(given)
    return values


def write(tmp_path, text):
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return path


def test_defaults(monkeypatch):
    monkeypatch.setattr(host.socket, "gethostname", lambda: "gpu-017.cluster.example.com")

    config = build_config(options(server=SERVER, token="join-1"))

    assert config == Config(server=SERVER, token="join-1", node_name="gpu-017")
    assert config.state_dir == "/var/lib/clusterui-agent"
    assert config.sample_interval_s == 1.0
    assert config.throttle_hold_s == 10.0
    assert config.kmsg_path == "/dev/kmsg"


def test_the_file_gives_every_key_and_the_command_line_wins(tmp_path):
    path = write(
        tmp_path,
        f'server = "{SERVER}"\n'
        'token = "join-from-file"\n'
        'state_dir = "/srv/agent"\n'
        'node_name = "gpu-001"\n'
        "sample_interval = 2\n"
        "throttle_hold = 30\n"
        'kmsg = "/var/log/kmsg-replay"\n'
        "simulate = true\n"
        "gpus = 4\n"
        'inject = ["xid:79@30s", "thermal@60s:gpu3"]\n'
        "verbose = true\n",
    )

    from_file = build_config(options(), read_config_file(path))
    overridden = build_config(
        options(token="join-from-cli", node_name="gpu-002"), read_config_file(path)
    )

    assert from_file == Config(
        server=SERVER,
        token="join-from-file",
        state_dir="/srv/agent",
        node_name="gpu-001",
        sample_interval_s=2.0,
        throttle_hold_s=30.0,
        kmsg_path="/var/log/kmsg-replay",
        simulate=True,
        gpus=4,
        inject=[Fault("xid", 30.0, xid=79), Fault("thermal", 60.0, gpu=3)],
        verbose=True,
    )
    assert (overridden.token, overridden.node_name, overridden.state_dir) == (
        "join-from-cli",
        "gpu-002",
        "/srv/agent",
    )


def test_the_example_config_is_valid():
    path = cli.__file__.replace("cli.py", "agent.example.toml")

    config = build_config(options(), read_config_file(path))

    assert config.server.startswith("wss://")


@pytest.mark.parametrize(
    "text, words",
    [
        ('servre = "wss://x/"\n', "unknown key 'servre'"),
        ("gpus = 8.5\n", "gpus must be an integer"),
        ('simulate = "yes"\n', "simulate must be true or false"),
        ("sample_interval = true\n", "sample_interval must be a number"),
        ('throttle_hold = "10"\n', "throttle_hold must be a number"),
        ("kmsg = 1\n", "kmsg must be a string"),
        ("server = \n", "not valid TOML"),
    ],
)
def test_a_bad_file_is_a_clear_error(tmp_path, text, words):
    with pytest.raises(ConfigError, match=words):
        read_config_file(write(tmp_path, text))


def test_a_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the config file"):
        read_config_file(tmp_path / "nope.toml")


@pytest.mark.parametrize(
    "given, words",
    [
        ({}, "no server"),
        ({"server": "https://x/ws/agent/"}, "must start with ws:// or wss://"),
        ({"server": SERVER, "node_name": "gpu 001"}, "node name 'gpu 001'"),
        ({"server": SERVER, "node_name": "n" * 64}, "is not 1-63"),
        ({"server": SERVER, "node_name": "-gpu"}, "starting with a letter or digit"),
        ({"server": SERVER, "sample_interval": 0}, "outside"),
        ({"server": SERVER, "throttle_hold": 0}, "throttle hold 0 s: above 0"),
        ({"server": SERVER, "throttle_hold": 7200}, "at most 3600 s"),
        ({"server": SERVER, "gpus": 4}, "--gpus only applies with --simulate"),
        ({"server": SERVER, "inject": ["xid:79@1s"]}, "--inject only applies with --simulate"),
        ({"server": SERVER, "simulate": True, "gpus": 0}, "1 to 64 GPUs"),
        ({"server": SERVER, "simulate": True, "inject": ["xid:79"]}, "bad --inject item"),
        (
            {"server": SERVER, "simulate": True, "gpus": 2, "inject": ["xid:79@1s:gpu2"]},
            "has 2 GPUs",
        ),
    ],
)
def test_bad_settings_are_clear_errors(given, words):
    with pytest.raises(ConfigError, match=words):
        build_config(options(**{"node_name": "gpu-001", **given}))


def test_print_once_needs_no_server():
    assert build_config(options(print_once=True, node_name="gpu-001")).server is None


def test_a_bad_inject_on_the_command_line_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["--print-once", "--simulate", "--inject", "xid:79@soon"])

    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m agent")
    assert "error: bad --inject item 'xid:79@soon'" in err


def test_no_token_at_all_is_a_clear_error(tmp_path, capsys):
    code = cli.main(["--server", SERVER, "--simulate", "--state-dir", str(tmp_path)])

    assert code == 2
    assert "no token: give a join token with --token-file" in capsys.readouterr().err


def test_the_detector_options_on_the_command_line():
    args = vars(cli.make_parser().parse_args(["--throttle-hold", "2.5", "--kmsg", "/tmp/kmsg"]))
    args.pop("config")

    config = build_config({**args, "server": SERVER, "node_name": "gpu-001"})

    assert (config.throttle_hold_s, config.kmsg_path) == (2.5, "/tmp/kmsg")


def test_node_hygiene_settings_come_from_the_file_and_the_command_line_wins(tmp_path):
    path = write(tmp_path, f'server = "{SERVER}"\ntoken = "t"\n'
                           "slurmd_restart = false\n"
                           'slurmd_restart_command = "slurmd -N gpu-001"\n'
                           "zombie_threshold = 3\n"
                           "pid_pressure_pct = 50\n"
                           'gres_conf = "/etc/slurm/gres.conf"\n')
    config = build_config(options(zombie_threshold=5), read_config_file(path))
    assert config.hygiene == HygieneConfig(
        slurmd_restart=False, slurmd_restart_command="slurmd -N gpu-001", zombie_threshold=5,
        pid_pressure_pct=50.0, gres_conf="/etc/slurm/gres.conf")
    assert config.hygiene.enabled is None  # not said: on for NVML, simulated for --simulate
    off = build_config(options(server=SERVER, token="t", hygiene=False))
    assert off.hygiene.enabled is False


@pytest.mark.parametrize("given, error", [
    ({"slurmd_flap_count": 0}, "slurmd flap count 0: 1 to 100"),
    ({"slurmd_flap_window": 5}, "slurmd flap window 5 s"),
    ({"zombie_threshold": 0}, "zombie threshold 0"),
    ({"pid_pressure_pct": 101}, "PID pressure 101 %"),
    ({"job_cleanup_grace": -1}, "job cleanup grace -1 s"),
    ({"gres_check_interval": 1}, "gres check interval 1 s"),
    ({"slurmd_restart_command": "   "}, "the slurmd restart command is empty"),
    ({"slurmd_restart_command": "slurmd '"}, "slurmd restart command"),
])
def test_bad_node_hygiene_settings_are_usage_errors(given, error):
    with pytest.raises(ConfigError, match=error):
        build_config(options(server=SERVER, token="t", **given))
