"""The agent's settings: command-line options over a TOML file (--config) over defaults.

The TOML file holds the same keys as the long options, with underscores:

    server = "wss://clusterui.example.com/ws/agent/"
    token = "..."                       # or token_file = "/etc/clusterui-agent/join-token"
    ca_file = "/etc/ssl/private-ca.pem"  # a private PKI's CA for wss://
    state_dir = "/var/lib/clusterui-agent"
    node_name = "gpu-001"
    sample_interval = 1.0
    throttle_hold = 10.0
    kmsg = "/dev/kmsg"
    reboot_command = "systemctl reboot"
    slurmd_restart = true               # node hygiene: see HYGIENE_KEYS below

The join token comes from a file (token_file, or the config file's token) or the
environment (CLUSTERUI_AGENT_TOKEN), never the command line: any local user reads that
with ps (PROTOCOL.md). The server is wss:// (its certificate verified, against ca_file when
given), or ws:// to this machine; ws:// to another needs --insecure: the token and every
frame would cross the network in plaintext.
"""

import ipaddress
import os
import re
import shlex
import ssl
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from agent import host
from agent.compat import tomllib
from agent.detectors.kernel_log import KMSG_PATH
from agent.detectors.throttle import THROTTLE_HOLD_S
from agent.work.commands import DEFAULT_REBOOT_COMMAND

DEFAULT_STATE_DIR = "/var/lib/clusterui-agent"
DEFAULT_SAMPLE_INTERVAL_S = 1.0
DEFAULT_OUTBOX_MAX_MB = 64
DEFAULT_SIMULATED_GPUS = 8
DEFAULT_SIMULATED_BOOT_S = 5.0
MIN_SAMPLE_INTERVAL_S = 0.05
MAX_SAMPLE_INTERVAL_S = 3600.0
MAX_THROTTLE_HOLD_S = 3600.0
MAX_SIMULATED_BOOT_S = 600.0

NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")  # PROTOCOL.md, hello.node

# key: (the types a TOML value may have, what to call them in an error)
FILE_KEYS = {
    "server": ((str,), "a string"),
    "token": ((str,), "a string"),
    "token_file": ((str,), "a string"),
    "ca_file": ((str,), "a string"),
    "insecure": ((bool,), "true or false"),
    "outbox_max_mb": ((int, float), "a number"),
    "state_dir": ((str,), "a string"),
    "node_name": ((str,), "a string"),
    "sample_interval": ((int, float), "a number"),
    "throttle_hold": ((int, float), "a number"),
    "kmsg": ((str,), "a string"),
    "reboot_command": ((str,), "a string"),
    "simulated_boot": ((int, float), "a number"),
    "simulate": ((bool,), "true or false"),
    "gpus": ((int,), "an integer"),
    "inject": ((str, list), "a string or a list of strings"),
    "verbose": ((bool,), "true or false"),
}

# Node hygiene on Slurm nodes (agent/hygiene/): key -> (types, what to call them, default).
# The hook (Slurm's Epilog) reads them from the same file.
HYGIENE_KEYS = {
    # All of it: on NVML nodes unless false; on --simulate, true watches this machine's real
    # Slurm daemons and processes (tests), unsaid simulates them (agent/sim/hygiene.py).
    "hygiene": ((bool,), "true or false", None),
    "slurmd_restart": ((bool,), "true or false", True),
    "slurmd_restart_command": ((str,), "a string", None),  # None: by how slurmd is watched
    "slurmd_pid_file": ((str,), "a string", None),  # None: scontrol show config's SlurmdPidFile
    "slurmd_unit": ((str,), "a string", "slurmd"),
    "slurmd_flap_count": ((int,), "an integer", 3),
    "slurmd_flap_window": ((int, float), "a number", 600.0),
    "zombie_threshold": ((int,), "an integer", 10),
    "pid_pressure_pct": ((int, float), "a number", 80.0),
    "process_check_interval": ((int, float), "a number", 30.0),
    "job_cleanup_grace": ((int, float), "a number", 10.0),
    "slurm_cgroup_root": ((str,), "a string", "/sys/fs/cgroup/system.slice/slurmstepd.scope"),
    "shm_dir": ((str,), "a string", "/dev/shm"),
    "gres_conf": ((str,), "a string", None),  # None: gres.conf beside $SLURM_CONF
    "gpu_device_dir": ((str,), "a string", "/dev"),
    "gres_check_interval": ((int, float), "a number", 300.0),
}
FILE_KEYS.update({key: (types, what) for key, (types, what, _) in HYGIENE_KEYS.items()})


TOKEN_ENVIRONMENT = "CLUSTERUI_AGENT_TOKEN"
TOKEN_ON_ARGV = ("a token on the command line is readable by every local user (ps): give "
                 f"--token-file FILE, token in --config FILE, or {TOKEN_ENVIRONMENT}")


class ConfigError(ValueError):
    """A setting that is missing or wrong; the message names it."""


def read_join_token(token_file, file_token=None, environ=os.environ):
    """The join token: from token_file, else the config file's `token`, else
    CLUSTERUI_AGENT_TOKEN; None when none is given."""
    if token_file:
        try:
            with open(token_file) as f:
                token = f.read().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read the token file {token_file}: {exc.strerror}") from exc
        if not token:
            raise ConfigError(f"the token file {token_file} is empty")
        return token
    return file_token or environ.get(TOKEN_ENVIRONMENT) or None


def check_server(url, *, insecure=False):
    """ws:// or wss://; ws:// only to this machine unless `insecure`."""
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss"):
        raise ConfigError(f"server {url!r} must start with ws:// or wss://")
    if parts.scheme == "ws" and not insecure and not is_loopback(parts.hostname or ""):
        raise ConfigError(
            f"server {url!r}: ws:// to another machine sends the token and every frame in "
            f"plaintext; use wss://, or give --insecure (a test network only)")


def is_loopback(host):
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def tls_context(server, ca_file):
    """The TLS settings for a wss:// server: the system's CAs, or ca_file's; None for ws://."""
    if not server.startswith("wss://"):
        return None
    try:
        return ssl.create_default_context(cafile=ca_file)  # verifies the certificate and name
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot read the CA file {ca_file}: {exc}") from exc


@dataclass(frozen=True)
class HygieneConfig:
    """Node hygiene's settings (HYGIENE_KEYS), checked."""

    enabled: bool | None = None  # None: not said (HYGIENE_KEYS)
    slurmd_restart: bool = True
    slurmd_restart_command: str | None = None
    slurmd_pid_file: str | None = None
    slurmd_unit: str = "slurmd"
    slurmd_flap_count: int = 3
    slurmd_flap_window_s: float = 600.0
    zombie_threshold: int = 10
    pid_pressure_pct: float = 80.0
    process_check_interval_s: float = 30.0
    job_cleanup_grace_s: float = 10.0
    slurm_cgroup_root: str = "/sys/fs/cgroup/system.slice/slurmstepd.scope"
    shm_dir: str = "/dev/shm"
    gres_conf: str | None = None
    gpu_device_dir: str = "/dev"
    gres_check_interval_s: float = 300.0


def build_hygiene_config(values):
    """The HygieneConfig of the settings in `values` (command line over file)."""
    def get(key):
        return values.get(key, HYGIENE_KEYS[key][2])

    config = HygieneConfig(
        enabled=get("hygiene"),
        slurmd_restart=bool(get("slurmd_restart")),
        slurmd_restart_command=get("slurmd_restart_command"),
        slurmd_pid_file=get("slurmd_pid_file"),
        slurmd_unit=get("slurmd_unit"),
        slurmd_flap_count=get("slurmd_flap_count"),
        slurmd_flap_window_s=float(get("slurmd_flap_window")),
        zombie_threshold=get("zombie_threshold"),
        pid_pressure_pct=float(get("pid_pressure_pct")),
        process_check_interval_s=float(get("process_check_interval")),
        job_cleanup_grace_s=float(get("job_cleanup_grace")),
        slurm_cgroup_root=get("slurm_cgroup_root"),
        shm_dir=get("shm_dir"),
        gres_conf=get("gres_conf"),
        gpu_device_dir=get("gpu_device_dir"),
        gres_check_interval_s=float(get("gres_check_interval")),
    )
    if config.slurmd_restart_command is not None:
        try:
            argv = shlex.split(config.slurmd_restart_command)
        except ValueError as exc:
            raise ConfigError(f"slurmd restart command {config.slurmd_restart_command!r}: "
                              f"{exc}") from exc
        if not argv:
            raise ConfigError("the slurmd restart command is empty")
    if not 1 <= config.slurmd_flap_count <= 100:
        raise ConfigError(f"slurmd flap count {config.slurmd_flap_count}: 1 to 100")
    if not 10 <= config.slurmd_flap_window_s <= 86400:
        raise ConfigError(f"slurmd flap window {config.slurmd_flap_window_s:g} s: 10 s to a day")
    if not 1 <= config.zombie_threshold <= 10_000_000:
        raise ConfigError(f"zombie threshold {config.zombie_threshold}: at least 1")
    if not 0 < config.pid_pressure_pct <= 100:
        raise ConfigError(f"PID pressure {config.pid_pressure_pct:g} %: above 0, at most 100")
    if not 0.5 <= config.process_check_interval_s <= 3600:
        raise ConfigError(f"process check interval {config.process_check_interval_s:g} s: "
                          f"0.5 s to an hour")
    if not 0 <= config.job_cleanup_grace_s <= 600:
        raise ConfigError(f"job cleanup grace {config.job_cleanup_grace_s:g} s: 0 to 600 s")
    if not 10 <= config.gres_check_interval_s <= 86400:
        raise ConfigError(f"gres check interval {config.gres_check_interval_s:g} s: 10 s to "
                          f"a day")
    return config


# --inject: a simulated node's faults on a schedule (what each does: agent/sim/inject.py)

_ITEM = re.compile(
    r"(?P<fault>xid:(?P<xid>[0-9]+)|xid_storm:(?P<storm>[0-9]+)|thermal|ecc_dbe|gpu_lost"
    r"|gres_drift|zombies|slurmd_flap|job_leftovers)"
    r"@(?P<at>[0-9]+(?:\.[0-9]+)?)s"
    r"(?:\+(?P<duration>[0-9]+(?:\.[0-9]+)?)s)?"
    r"(?::gpu(?P<gpu>[0-9]+))?"
)

USAGE = (
    "expected comma-separated items like xid:79@30s, xid:48@10s:gpu3, thermal@60s, "
    "thermal@60s+30s:gpu1, xid_storm:13@20s, ecc_dbe@40s:gpu2, gpu_lost@90s, "
    "gres_drift@30s, zombies@30s, slurmd_flap@30s or job_leftovers@30s:gpu1"
)


class InjectSpecError(ValueError):
    pass


@dataclass(frozen=True)
class Fault:
    kind: str  # "xid", "xid_storm", "thermal", "ecc_dbe", "gpu_lost", or node hygiene's
    at_s: float  # seconds after the agent started
    gpu: int = 0  # the GPU's index
    xid: int | None = None  # kinds "xid" and "xid_storm" only
    duration_s: float | None = None  # kind "thermal" only; None: until the agent stops

    @property
    def label(self):
        """"xid:79", "thermal", "gpu_lost"...: how the agent's log names the fault."""
        return f"{self.kind}:{self.xid}" if self.xid is not None else self.kind


def parse_inject(spec):
    """The faults a --inject value names, in the order given."""
    faults = []
    for item in spec.split(","):
        item = item.strip()
        match = _ITEM.fullmatch(item)
        if match is None:
            raise InjectSpecError(f"bad --inject item {item!r}: {USAGE}")
        if match["xid"] is not None:
            kind, code = "xid", int(match["xid"])
        elif match["storm"] is not None:
            kind, code = "xid_storm", int(match["storm"])
        else:
            kind, code = match["fault"], None
        if match["duration"] is not None and kind != "thermal":
            raise InjectSpecError(
                f"bad --inject item {item!r}: only thermal takes a duration (+<d>s)"
            )
        if code == 0:
            raise InjectSpecError(f"bad --inject item {item!r}: Xid codes start at 1")
        if match["duration"] is not None and float(match["duration"]) == 0:
            raise InjectSpecError(f"bad --inject item {item!r}: the duration must be above 0 s")
        faults.append(
            Fault(
                kind=kind,
                at_s=float(match["at"]),
                gpu=int(match["gpu"]) if match["gpu"] is not None else 0,
                xid=code,
                duration_s=float(match["duration"]) if match["duration"] is not None else None,
            )
        )
    return faults


def check_gpu_indexes(faults, gpu_count):
    """Every fault names a GPU the simulated node has."""
    for fault in faults:
        if fault.gpu >= gpu_count:
            raise InjectSpecError(
                f"--inject names gpu{fault.gpu}, but the simulated node has {gpu_count} "
                f"GPUs (gpu0 to gpu{gpu_count - 1})"
            )


@dataclass
class Config:
    server: str | None = None
    token: str | None = None  # the join token (a stored node token wins over it)
    ca_file: str | None = None
    insecure: bool = False
    outbox_max_mb: float = DEFAULT_OUTBOX_MAX_MB
    state_dir: str = DEFAULT_STATE_DIR
    node_name: str = ""
    sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S
    throttle_hold_s: float = THROTTLE_HOLD_S  # how long throttling holds before an event
    kmsg_path: str = KMSG_PATH  # the kernel log the Xid watcher reads (NVML backend)
    reboot_command: str = DEFAULT_REBOOT_COMMAND  # run for the server's `reboot` (NVML backend)
    simulated_boot_s: float = DEFAULT_SIMULATED_BOOT_S  # how long a simulated node is down
    simulate: bool = False
    gpus: int = DEFAULT_SIMULATED_GPUS
    inject: list[Fault] = field(default_factory=list)
    print_once: bool = False
    verbose: bool = False
    hygiene: HygieneConfig = field(default_factory=HygieneConfig)


def read_config_file(path):
    """The settings in a TOML file, checked against FILE_KEYS."""
    try:
        with open(path, "rb") as f:
            values = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read the config file {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    for key, value in values.items():
        if key not in FILE_KEYS:
            raise ConfigError(f"{path}: unknown key {key!r} (known: {', '.join(FILE_KEYS)})")
        allowed, described = FILE_KEYS[key]
        # TOML booleans are not numbers here, though Python's bool is an int.
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            raise ConfigError(f"{path}: {key} must be {described}, not {value!r}")
    return values


def build_config(options, file_values=None, environ=os.environ):
    """options: the command line's values (None where not given); file_values: the
    config file's. The command line wins."""
    values = dict(file_values or {})
    values.update({key: value for key, value in options.items() if value is not None})
    config = _read_values(values, environ)
    _check_node_and_server(config)
    _check_reboot(config, values)
    _check_simulation(config, values)
    return config


def _read_values(values, environ):
    """The Config of the merged values, unchecked (but for the join token's file)."""
    return Config(
        server=values.get("server"),
        token=read_join_token(values.get("token_file"), values.get("token"), environ),
        ca_file=values.get("ca_file"),
        insecure=bool(values.get("insecure", False)),
        outbox_max_mb=float(values.get("outbox_max_mb", DEFAULT_OUTBOX_MAX_MB)),
        state_dir=values.get("state_dir", DEFAULT_STATE_DIR),
        node_name=values.get("node_name") or host.short_hostname(),
        sample_interval_s=float(values.get("sample_interval", DEFAULT_SAMPLE_INTERVAL_S)),
        throttle_hold_s=float(values.get("throttle_hold", THROTTLE_HOLD_S)),
        kmsg_path=values.get("kmsg", KMSG_PATH),
        reboot_command=values.get("reboot_command", DEFAULT_REBOOT_COMMAND),
        simulated_boot_s=float(values.get("simulated_boot", DEFAULT_SIMULATED_BOOT_S)),
        simulate=bool(values.get("simulate", False)),
        gpus=values.get("gpus", DEFAULT_SIMULATED_GPUS),
        print_once=bool(values.get("print_once", False)),
        verbose=bool(values.get("verbose", False)),
        hygiene=build_hygiene_config(values),
    )


def _check_node_and_server(config):
    """The node's name, the outbox, the intervals, and the server (unless --print-once)."""
    if not NODE_NAME.fullmatch(config.node_name):
        raise ConfigError(
            f"node name {config.node_name!r} is not 1-63 letters, digits, '-', '_' or '.' "
            "starting with a letter or digit"
        )
    if not 1 <= config.outbox_max_mb <= 100_000:
        raise ConfigError(f"outbox max {config.outbox_max_mb:g} MB: 1 to 100,000 MB")
    if not MIN_SAMPLE_INTERVAL_S <= config.sample_interval_s <= MAX_SAMPLE_INTERVAL_S:
        raise ConfigError(
            f"sample interval {config.sample_interval_s:g} s is outside "
            f"{MIN_SAMPLE_INTERVAL_S:g}-{MAX_SAMPLE_INTERVAL_S:g} s"
        )
    if not 0 < config.throttle_hold_s <= MAX_THROTTLE_HOLD_S:
        raise ConfigError(
            f"throttle hold {config.throttle_hold_s:g} s: above 0 and at most {MAX_THROTTLE_HOLD_S:g} s"
        )
    if not config.print_once:
        if not config.server:
            raise ConfigError(
                "no server: give --server wss://HOST/ws/agent/ (or server in --config)"
            )
        check_server(config.server, insecure=config.insecure)
        if config.ca_file and not config.server.startswith("wss://"):
            raise ConfigError("--ca-file applies to a wss:// server only")


def _check_reboot(config, values):
    try:
        reboot_argv = shlex.split(config.reboot_command)
    except ValueError as exc:
        raise ConfigError(f"reboot command {config.reboot_command!r}: {exc}") from exc
    if not reboot_argv:
        raise ConfigError("the reboot command is empty")
    if "reboot_command" in values and config.simulate:
        raise ConfigError("--reboot-command does not apply with --simulate (the node reboots "
                          "in simulation)")


def _check_simulation(config, values):
    """--simulated-boot, --gpus and --inject: with --simulate only; the faults parsed into
    config.inject."""
    if "simulated_boot" in values and not config.simulate:
        raise ConfigError("--simulated-boot only applies with --simulate")
    if not 0 <= config.simulated_boot_s <= MAX_SIMULATED_BOOT_S:
        raise ConfigError(f"--simulated-boot {config.simulated_boot_s:g} s: 0 to "
                          f"{MAX_SIMULATED_BOOT_S:g} s")
    if "gpus" in values and not config.simulate:
        raise ConfigError("--gpus only applies with --simulate (real GPUs are counted)")
    if not 1 <= config.gpus <= 64:
        raise ConfigError(f"--gpus {config.gpus}: a simulated node has 1 to 64 GPUs")

    inject = values.get("inject", [])
    if isinstance(inject, str):
        inject = [inject]
    if not all(isinstance(spec, str) for spec in inject):
        raise ConfigError(f"inject must be a string or a list of strings, not {inject!r}")
    if inject and not config.simulate:
        raise ConfigError("--inject only applies with --simulate")
    try:
        for spec in inject:
            config.inject.extend(parse_inject(spec))
        check_gpu_indexes(config.inject, config.gpus)
    except InjectSpecError as exc:
        raise ConfigError(str(exc)) from exc
