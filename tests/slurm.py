"""A real Slurm cluster on this machine, for tests: munged, optionally MariaDB and slurmdbd
(accounting), slurmctld and one slurmd per fake node, everything (keys, configs, state,
spool, logs) under one folder. See ../shared/notes/slurm-in-tests.md for why each setting
is what it is.

    cluster = SlurmCluster(tmp / "slurm", nodes=["gpu-001", "gpu-002"], accounting=True)
    cluster.start()                       # a few seconds; SlurmClusterError with the logs
    cluster.add_user("alice", "research") # useradd + sacctmgr (account made if missing)
    job_id = cluster.sbatch("sleep 30", user="alice", gres="gpu:2", nodelist="gpu-001")
    cluster.run(["scontrol", "show", "node", "gpu-001", "-o"]).stdout
    cluster.set_conf(Prolog="/path/prolog.sh", Epilog=None)  # then scontrol reconfigure
    cluster.restart_daemon("slurmdbd")    # or "slurmctld", "slurmd gpu-002", "mariadbd"
    cluster.reset()                       # no jobs, every node back in service
    cluster.stop()                        # cancels the jobs, then stops by recorded pid
                                          # (and a slurmd restarted outside the harness,
                                          # by its pid file: cluster.slurmd_pid(node))

Tests take the `slurm` fixture (tests/conftest.py): one such cluster with accounting for
the whole session, reset after each test.

Each node advertises `gpus_per_node` GPUs through gres (fake device files, copies of
/dev/null). Commands that should talk to this cluster get `cluster.env` (SLURM_CONF).
Needs root (slurmd runs jobs as other users) and the Debian packages that scripts/test.sh
installs; `missing_requirements()` says what is lacking.
"""

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from .browser import _die_with_parent, free_port

DEFAULT_NODES = ("gpu-001", "gpu-002", "gpu-003", "gpu-004")
DEBIAN_PACKAGES = "munge slurmctld slurmd slurm-client slurmdbd mariadb-server"
REQUIRED_PROGRAMS = (
    "mungekey", "munged", "slurmctld", "slurmd", "scontrol", "sinfo", "squeue", "sbatch",
    "srun", "scancel", "sacct", "sacctmgr", "slurmdbd", "mariadbd", "mariadb-install-db",
)
COMMAND_TIMEOUT_S = 30

# sinfo's compact states (%t) of a node in service: anything else has a flag (drain,
# drng, idle* for not responding, down...).
READY_STATES = {"idle", "mix", "alloc"}


class SlurmClusterError(Exception):
    """The cluster did not start, or a command against it failed; str() says why."""


def missing_requirements():
    """What this machine lacks to run a SlurmCluster, as one line, or "" when nothing."""
    lacking = []
    if os.geteuid() != 0:
        lacking.append("root (slurmd runs the jobs as their users)")
    programs = [p for p in REQUIRED_PROGRAMS if shutil.which(p) is None]
    if programs:
        lacking.append(f"the programs {', '.join(programs)}")
    return "; ".join(lacking)


def short_hostname():
    return socket.gethostname().split(".")[0]


class Daemon:
    """One daemon in the foreground, its output in a log file, stopped by its pid."""

    def __init__(self, name, argv, *, env, log_path):
        self.name = name
        self.argv = [str(a) for a in argv]
        self.env = env
        self.log_path = Path(log_path)
        self.process = None

    def start(self):
        with self.log_path.open("ab") as log:
            log.write(f"=== {time.strftime('%H:%M:%S')} start: {' '.join(self.argv)}\n".encode())
            log.flush()
            # Its own session: a Ctrl-C meant for pytest must not stop the daemons before
            # the fixture's teardown has cancelled the jobs through them.
            self.process = subprocess.Popen(
                self.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent,
            )
        return self

    def running(self):
        return self.process is not None and self.process.poll() is None

    def check_running(self):
        if self.process is not None and self.process.poll() is not None:
            raise SlurmClusterError(
                f"{self.name} exited with status {self.process.returncode}; its log:\n"
                f"{self.log_tail()}")

    def stop(self, timeout=5.0):
        """SIGTERM, then SIGKILL after `timeout` s (a slurmd may ignore SIGTERM once
        slurmctld is gone)."""
        if not self.running():
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def log_tail(self, lines=40):
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(nothing logged)"


def wait_for(predicate, *, timeout, what, interval=0.1, alive=()):
    """Poll `predicate` until it returns something truthy (returned); fail with the logs of
    `alive` (Daemons) at once when one of them exits, or after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        for daemon in alive:
            daemon.check_running()
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {d.name}:\n{d.log_tail()}" for d in alive)
            raise SlurmClusterError(f"not within {timeout:g} s: {what}\n{logs}")
        time.sleep(interval)


def live_process(pid, comm):
    """Whether `pid` runs the program `comm` and is not a zombie (a daemon's parent may
    never reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    name = stat[stat.find("(") + 1 : stat.rfind(")")]
    state = stat[stat.rfind(")") + 2 :].split()[0]
    return name == comm and state not in ("Z", "X")


def port_open(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class SlurmCluster:
    """A Slurm cluster under `directory` (created; kept after stop() for its logs)."""

    def __init__(self, directory, *, nodes=DEFAULT_NODES, gpus_per_node=8, cpus_per_node=8,
                 accounting=False, conf=None, cluster_name="clusterui-test"):
        self.directory = Path(directory)
        self.nodes = list(nodes)
        self.gpus_per_node = gpus_per_node
        self.cpus_per_node = cpus_per_node
        self.accounting = accounting
        self.cluster_name = cluster_name
        # slurm.conf lines the caller sets (Prolog, Epilog, AccountingStorageEnforce, ...);
        # they come after ours, and Slurm takes the last value of a key.
        self.conf = dict(conf or {})
        self.hostname = short_hostname()
        self.etc = self.directory / "etc"
        self.logs = self.directory / "log"
        self.slurm_conf = self.etc / "slurm.conf"
        self.munge_socket = self.directory / "munge" / "munge.socket.2"
        self.jobs_dir = self.directory / "jobs"
        self.env = {**os.environ, "SLURM_CONF": str(self.slurm_conf)}
        self.daemons = {}
        self.users_added = []
        self.ports = {}
        self.start_time_s = None
        self.conf_at_start = dict(self.conf)

    # --- start and stop ------------------------------------------------------------------

    def start(self, timeout=60.0):
        """Write the configuration and start every daemon; returns self once every node is
        idle. On failure stops what it started and raises SlurmClusterError with logs."""
        started = time.monotonic()
        self.conf_at_start = dict(self.conf)
        try:
            self._prepare()
            self._start_munged(timeout)
            if self.accounting:
                self._start_mariadbd(timeout)
                self._start_slurmdbd(timeout)
            self._start_slurmctld(timeout)
            self._start_slurmds(timeout)
        except BaseException:
            self.stop()
            raise
        self.start_time_s = time.monotonic() - started
        return self

    def stop(self):
        """Cancel every job (its slurmstepd would outlive the daemons), then stop the
        daemons by their pids, slurmds first; remove the users add_user() created."""
        slurmctld = self.daemons.get("slurmctld")
        if slurmctld is not None and slurmctld.running():
            try:
                self.cancel_all_jobs()
            except SlurmClusterError as exc:
                print(f"SlurmCluster.stop: cancelling the jobs failed: {exc}")
        order = [n for n in self.daemons if n.startswith("slurmd ")]
        order += ["slurmctld", "slurmdbd", "mariadbd", "munged"]
        for name in order:
            daemon = self.daemons.get(name)
            if daemon is not None:
                daemon.stop()
            if name.startswith("slurmd "):
                self.stop_restarted_slurmd(name.removeprefix("slurmd "))
        for user in self.users_added:
            subprocess.run(["userdel", user], capture_output=True, timeout=COMMAND_TIMEOUT_S)
        self.users_added = []

    def _prepare(self):
        # A fresh cluster each time: mkdir fails on a folder a cluster already used.
        self.directory.mkdir(parents=True, exist_ok=True)
        for sub in ("etc", "log", "run", "state", "spool", "dev", "munge", "jobs"):
            (self.directory / sub).mkdir()
        # Every user reads the configuration and talks to munged; job output lands in jobs/.
        self.directory.chmod(0o755)
        (self.directory / "munge").chmod(0o755)
        self.jobs_dir.chmod(0o1777)
        for i in range(self.gpus_per_node):
            device = self.directory / "dev" / f"nvidia{i}"
            os.mknod(device, 0o666 | 0o020000, os.makedev(1, 3))  # a copy of /dev/null
            device.chmod(0o666)
        self.ports = {"slurmctld": free_port(), "slurmdbd": free_port(), "mariadbd": free_port()}
        for node in self.nodes:
            self.ports[node] = free_port()
        self._write_slurm_conf()
        (self.etc / "gres.conf").write_text(
            "AutoDetect=off\n"
            f"NodeName={','.join(self.nodes)} Name=gpu "
            f"File={self.directory}/dev/nvidia[0-{self.gpus_per_node - 1}]\n")
        if self.accounting:
            dbd_conf = self.etc / "slurmdbd.conf"
            dbd_conf.write_text(self._slurmdbd_conf())
            dbd_conf.chmod(0o600)  # slurmdbd refuses it otherwise

    def _write_slurm_conf(self):
        d = self.directory
        lines = [
            f"ClusterName={self.cluster_name}",
            f"SlurmctldHost={self.hostname}(127.0.0.1)",
            f"SlurmctldPort={self.ports['slurmctld']}",
            "SlurmUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={d}/state",
            f"SlurmdSpoolDir={d}/spool/%n",
            f"SlurmctldPidFile={d}/run/slurmctld.pid",
            f"SlurmdPidFile={d}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={d}/log/slurmctld.log",
            f"SlurmdLogFile={d}/log/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "SlurmdParameters=config_overrides",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SwitchType=switch/none",
            "SelectType=select/cons_tres",
            # Cores only: with memory consumable, a job without --mem takes a whole node.
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "MailProg=/bin/true",
            "KillWait=2",
            # Start a submitted batch job within a second rather than about three.
            "SchedulerParameters=batch_sched_delay=0",
            "MpiDefault=none",
            "GresTypes=gpu",
        ]
        if self.accounting:
            lines += [
                # Without slurmdbd slurmctld refuses to track gres/gpu as a TRES.
                "AccountingStorageTRES=gres/gpu",
                "JobAcctGatherType=jobacct_gather/linux",
                "AccountingStorageType=accounting_storage/slurmdbd",
                "AccountingStorageHost=127.0.0.1",
                f"AccountingStoragePort={self.ports['slurmdbd']}",
                # Without it slurmctld asks munge at /run/munge and exits ("no TRES").
                f"AccountingStoragePass={self.munge_socket}",
            ]
        for node in self.nodes:
            lines.append(
                f"NodeName={node} NodeHostname={self.hostname} NodeAddr=127.0.0.1 "
                f"Port={self.ports[node]} CPUs={self.cpus_per_node} RealMemory=1000 "
                f"Gres=gpu:{self.gpus_per_node} State=UNKNOWN")
        lines.append("PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        lines += [f"{key}={value}" for key, value in self.conf.items()]
        self.slurm_conf.write_text("\n".join(lines) + "\n")

    def _slurmdbd_conf(self):
        d = self.directory
        return "\n".join([
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"DbdHost={self.hostname}",
            "DbdAddr=127.0.0.1",
            f"DbdPort={self.ports['slurmdbd']}",
            "SlurmUser=root",
            f"PidFile={d}/run/slurmdbd.pid",
            f"LogFile={d}/log/slurmdbd.log",
            "DebugLevel=info",
            "StorageType=accounting_storage/mysql",
            "StorageHost=127.0.0.1",
            f"StoragePort={self.ports['mariadbd']}",
            "StorageUser=root",
            "StorageLoc=slurm_acct_db",
        ]) + "\n"

    def _daemon(self, name, argv):
        safe = name.replace(" ", "-")
        daemon = Daemon(name, argv, env=self.env, log_path=self.logs / f"{safe}.out")
        self.daemons[name] = daemon
        return daemon.start()

    def _start_munged(self, timeout):
        munge_dir = self.directory / "munge"
        key = self.directory / "munge-key" / "munge.key"
        key.parent.mkdir(mode=0o700)
        self._check_call(["mungekey", "--create", f"--keyfile={key}"])
        daemon = self._daemon("munged", [
            "munged", "-F", f"--key-file={key}", f"--socket={self.munge_socket}",
            f"--pid-file={munge_dir}/munged.pid", f"--seed-file={munge_dir}/munged.seed",
            f"--log-file={self.logs}/munged.log",
        ])
        wait_for(self.munge_socket.exists, timeout=timeout, what="munged's socket",
                 alive=[daemon])

    def _start_mariadbd(self, timeout):
        datadir = self.directory / "mariadb"
        self._check_call([
            "mariadb-install-db", "--no-defaults", f"--datadir={datadir}", "--user=root",
            "--skip-test-db", "--auth-root-authentication-method=normal",
        ])
        # Grant tables off: a throwaway server on loopback, and slurmdbd logs in as root
        # without a password.
        daemon = self._daemon("mariadbd", [
            "mariadbd", "--no-defaults", f"--datadir={datadir}", "--user=root",
            f"--socket={datadir}/mariadbd.sock", f"--port={self.ports['mariadbd']}",
            "--bind-address=127.0.0.1", f"--pid-file={datadir}/mariadbd.pid",
            "--skip-grant-tables", "--skip-log-bin", "--innodb-flush-log-at-trx-commit=0",
            "--innodb-buffer-pool-size=64M",
        ])
        wait_for(lambda: port_open(self.ports["mariadbd"]), timeout=timeout,
                 what="mariadbd listens", alive=[daemon])

    def _start_slurmdbd(self, timeout):
        daemon = self._daemon("slurmdbd", ["slurmdbd", "-D"])
        wait_for(lambda: port_open(self.ports["slurmdbd"]), timeout=timeout,
                 what="slurmdbd listens", alive=[daemon, self.daemons["mariadbd"]])

    def _start_slurmctld(self, timeout):
        daemon = self._daemon("slurmctld", ["slurmctld", "-D", "-i"])
        wait_for(lambda: port_open(self.ports["slurmctld"]), timeout=timeout,
                 what="slurmctld listens", alive=[daemon])
        if self.accounting:
            # slurmctld registers its cluster with slurmdbd; sacctmgr needs it there.
            wait_for(lambda: self.cluster_name in self._sacctmgr_list("cluster", "Cluster"),
                     timeout=timeout, what=f"slurmdbd knows the cluster {self.cluster_name}",
                     alive=[daemon, self.daemons["slurmdbd"]], interval=0.2)

    def _start_slurmds(self, timeout):
        for node in self.nodes:
            self._daemon(f"slurmd {node}", ["slurmd", "-D", "-N", node])
        self.wait_nodes_ready(timeout)

    def wait_nodes_ready(self, timeout=30.0, nodes=None):
        """Wait until every node (or those named) is in service: idle, mixed or
        allocated, not drained, down or not responding."""
        nodes = nodes or self.nodes

        def ready():
            states = self.node_states()
            return all(states.get(node) in READY_STATES for node in nodes)

        wait_for(ready, timeout=timeout, what=f"nodes {', '.join(nodes)} ready",
                 alive=self._slurm_daemons())

    def _slurm_daemons(self):
        """The Slurm daemons whose exit fails a wait. A slurmd that was replaced in place (its
        pid file names another live slurmd) is not missed."""
        daemons = []
        for name, daemon in self.daemons.items():
            if not name.startswith("slurm"):
                continue
            if name.startswith("slurmd ") and not daemon.running():
                pid = self.slurmd_pid(name.removeprefix("slurmd "))
                if pid is not None and live_process(pid, "slurmd"):
                    continue
            daemons.append(daemon)
        return daemons

    def restart_daemon(self, name, timeout=30.0):
        """Stop one daemon by its pid and start it again with the same arguments, e.g.
        "slurmdbd", "slurmctld" or "slurmd gpu-002"; returns once it listens again (and,
        for slurmctld or a slurmd, once the nodes are back in service)."""
        daemon = self.daemons[name]
        daemon.stop()
        if name.startswith("slurmd "):
            self.stop_restarted_slurmd(name.removeprefix("slurmd "))
        daemon.start()
        port = self.ports.get(name.removeprefix("slurmd "))
        if port is None:  # munged: a socket, no port
            wait_for(self.munge_socket.exists, timeout=timeout, what="munged's socket",
                     alive=[daemon])
        else:
            wait_for(lambda: port_open(port), timeout=timeout, what=f"{name} listens again",
                     alive=[daemon])
        if name == "slurmctld":
            self.wait_nodes_ready(timeout)
        elif name.startswith("slurmd "):
            self.wait_nodes_ready(timeout, nodes=[name.removeprefix("slurmd ")])

    def slurmd_pid(self, node):
        """The pid in the node's slurmd pid file (SlurmdPidFile), whoever started that
        slurmd: this harness, or a test or the agent that restarted it in place."""
        try:
            return int((self.directory / "run" / f"slurmd-{node}.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def stop_restarted_slurmd(self, node, timeout=5.0):
        """Stop the node's slurmd that something other than this harness started (e.g.
        `slurmd -N <node>`, which daemonizes): the live slurmd its pid file names. SIGTERM,
        then SIGKILL after `timeout` s."""
        pid = self.slurmd_pid(node)
        if pid is None or not live_process(pid, "slurmd"):
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and live_process(pid, "slurmd"):
                time.sleep(0.05)
            if not live_process(pid, "slurmd"):
                return

    # --- commands ------------------------------------------------------------------------

    def run(self, argv, *, user=None, check=True, timeout=COMMAND_TIMEOUT_S, input=None):
        """Run a command against this cluster (SLURM_CONF set), as `user` if given;
        CompletedProcess with text output. check: raise SlurmClusterError on exit != 0."""
        argv = [str(a) for a in argv]
        if user is not None:
            argv = ["runuser", "-u", user, "--", *argv]
        try:
            result = subprocess.run(argv, env=self.env, capture_output=True, text=True,
                                    timeout=timeout, input=input, cwd=self.jobs_dir)
        except subprocess.TimeoutExpired as exc:
            raise SlurmClusterError(f"{' '.join(argv)}: no answer within {timeout} s") from exc
        if check and result.returncode != 0:
            raise SlurmClusterError(f"{' '.join(argv)} exited with {result.returncode}: "
                                    f"{result.stderr.strip() or result.stdout.strip()}")
        return result

    def _check_call(self, argv):
        result = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
        if result.returncode != 0:
            raise SlurmClusterError(f"{' '.join(argv)} exited with {result.returncode}: "
                                    f"{result.stdout}{result.stderr}")

    def sbatch(self, command, *, user=None, account=None, gres=None, gpus=None,
               nodelist=None, name=None, extra=()):
        """Submit `command` as a batch job (`sbatch --wrap`); its job id. Output goes to
        jobs/<id>.out under the cluster's folder."""
        argv = ["sbatch", "--parsable", f"--output={self.jobs_dir}/%j.out"]
        if account:
            argv.append(f"--account={account}")
        if gres:
            argv.append(f"--gres={gres}")
        if gpus:
            argv.append(f"--gpus={gpus}")
        if nodelist:
            argv.append(f"--nodelist={nodelist}")
        if name:
            argv.append(f"--job-name={name}")
        argv += [*extra, "--wrap", command]
        # --parsable prints "<id>" or "<id>;<cluster>".
        return self.run(argv, user=user).stdout.strip().split(";")[0]

    def node_states(self):
        """{node: sinfo's compact state}, e.g. "idle", "drain", "drng", "mix", "idle*"."""
        result = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False, timeout=15)
        states = {}
        for line in result.stdout.splitlines():
            node, _, state = line.partition(" ")
            states[node] = state.strip()
        return states

    def job_state(self, job_id):
        """squeue's state of a job still in slurmctld's memory (e.g. "RUNNING", "PENDING",
        "COMPLETED"), or "" once it is gone."""
        result = self.run(["squeue", "-h", "-j", job_id, "-t", "all", "-o", "%T"],
                          check=False, timeout=15)
        return result.stdout.strip()

    def wait_job_state(self, job_id, state, timeout=30.0):
        wait_for(lambda: self.job_state(job_id) == state, timeout=timeout,
                 what=f"job {job_id} {state}", alive=self._slurm_daemons())

    def job_node(self, job_id):
        """The node list of a job ("" while it has none)."""
        return self.run(["squeue", "-h", "-j", job_id, "-t", "all", "-o", "%N"]).stdout.strip()

    def cancel_all_jobs(self, timeout=30.0):
        """scancel every job and wait until none is left running or completing."""
        ids = self.run(["squeue", "-h", "-o", "%i"], timeout=15).stdout.split()
        if ids:
            self.run(["scancel", *ids], check=False)

        def none_active():
            out = self.run(["squeue", "-h", "-o", "%i %t"], check=False, timeout=15).stdout
            return not out.strip()

        wait_for(none_active, timeout=timeout, what="every job cancelled",
                 alive=self._slurm_daemons(), interval=0.2)

    def reset(self, timeout=30.0):
        """Back to a clean cluster between tests: no jobs, slurm.conf as at start (no
        Prolog left from set_conf), every node resumed and ready."""
        self.cancel_all_jobs(timeout)
        if self.conf != self.conf_at_start:
            self.conf = dict(self.conf_at_start)
            self._write_slurm_conf()
            self.run(["scontrol", "reconfigure"])
        not_ready = [n for n, s in self.node_states().items()
                     if s not in READY_STATES and n in self.nodes]
        if not_ready:
            self.run(["scontrol", "update", f"nodename={','.join(not_ready)}", "state=resume"],
                     check=False)
        self.wait_nodes_ready(timeout)

    def set_conf(self, **lines):
        """Set (a value) or remove (None) slurm.conf keys, e.g. Prolog=..., Epilog=...,
        then `scontrol reconfigure` (slurmctld and every slurmd read it again). Keys that
        Slurm reads only at start need restart_daemon("slurmctld") instead."""
        for key, value in lines.items():
            if value is None:
                self.conf.pop(key, None)
            else:
                self.conf[key] = value
        self._write_slurm_conf()
        self.run(["scontrol", "reconfigure"])
        self.wait_nodes_ready()

    # --- users and accounts (accounting) -------------------------------------------------

    def _sacctmgr_list(self, entity, field):
        result = self.run(["sacctmgr", "-n", "-P", "show", entity, f"format={field}"],
                          check=False, timeout=15)
        return result.stdout.split()

    def add_account(self, account):
        """`sacctmgr add account` (needs accounting); nothing if it exists."""
        if account not in self._sacctmgr_list("account", "Account"):
            self.run(["sacctmgr", "-i", "add", "account", account,
                      f"cluster={self.cluster_name}"])

    def add_user(self, user, account=None):
        """A system user (useradd, removed again by stop()) and, with an account, its
        association in Slurm's accounting (the account is made if missing)."""
        try:
            pwd.getpwnam(user)
        except KeyError:
            self._check_call(["useradd", "--no-create-home", "--shell", "/bin/sh",
                              "--user-group", user])
            self.users_added.append(user)
        if account is not None:
            self.add_account(account)
            result = self.run(["sacctmgr", "-i", "add", "user", user, f"account={account}",
                               f"cluster={self.cluster_name}"], check=False)
            # Added by an earlier test of the session: sacctmgr says so and exits 1.
            if result.returncode != 0 and "Nothing new added" not in result.stdout:
                raise SlurmClusterError(f"sacctmgr add user {user} exited with "
                                        f"{result.returncode}: {result.stderr.strip()}")

    # --- failure reports -----------------------------------------------------------------

    def keep_logs(self, destination):
        """Copy the logs to `destination` (e.g. under test-artifacts/), replacing it."""
        destination = Path(destination)
        shutil.rmtree(destination, ignore_errors=True)
        shutil.copytree(self.logs, destination)

    def log_tails(self, lines=40):
        """The end of every daemon's log (and of Slurm's own log files), for a report."""
        parts = []
        for daemon in self.daemons.values():
            parts.append(f"----- {daemon.name}: {daemon.log_path} -----\n"
                         f"{daemon.log_tail(lines)}")
        for path in sorted(self.logs.glob("*.log")):
            tail = "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            parts.append(f"----- {path} -----\n{tail}")
        return "\n".join(parts)

