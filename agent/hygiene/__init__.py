"""Node hygiene (DESIGN.md "Node hygiene"): what keeps a Slurm node usable beyond the health
signals of agent/detectors.

    module        what                                           signatures
    slurmd        slurmd kept alive: its systemd unit or its     slurmd_restarted (a notice),
                  pid file; a dead one restarted in place        slurmd_down, slurmd_flapping
    processes     zombies, orphans of ended jobs, PID usage;     zombie_processes,
                  the operator's clean-up (command `cleanup`)    pid_pressure
    job_cleanup   at job end (Slurm's Epilog: agent/hook.py)     job_cleanup (a notice),
                  every process of the job ended, GPU memory     job_leftovers
                  checked, the user's /dev/shm files removed
    gres          NVML's GPUs against Slurm's gres; the          gres_drift
                  `reconfigure` repair (command `reconfigure`)

make_hygiene(config, nvml) builds them for a node read through NVML: the process
watcher everywhere, the rest where scontrol exists (a Slurm node). Their readings travel
in samples (`hygiene`, Hygiene.status()); their events like every other watcher's. (The
simulation's own hygiene is agent/sim/hygiene.py.)
"""

import asyncio
import logging
import shutil

from agent import host
from agent.work.commands import CommandFailed

log = logging.getLogger(__name__)


class Hygiene:
    """The started hygiene watchers (the client polls them; agent.detectors.close_watchers
    stops them with the rest), their readings for the sample, and the commands they carry
    out. parts: {sample key: a callable giving its reading, or None before one}."""

    def __init__(self, *, watchers=(), parts=None, commands=None):
        self.watchers = list(watchers)
        self.parts = dict(parts or {})
        self.commands = commands

    def status(self):
        """{"slurmd": ..., "processes": ..., "gres": ...}: each part read at least once
        (PROTOCOL.md sample.hygiene), or None when none is."""
        readings = {}
        for part, read in self.parts.items():
            status = read()
            if status is not None:
                readings[part] = status
        return readings or None


class HygieneCommands:
    """The server's `cleanup` (any node with a process watcher) and `reconfigure` (a Slurm
    node) commands. Each runs in a thread (they wait on processes and on Slurm) and answers
    `ok` with what it did, or `failed` with why."""

    def __init__(self, *, node_name, settings, slurmd=None, gres_watcher=None):
        self._node_name = node_name
        self._settings = settings  # agent.config.HygieneConfig
        self._slurmd = slurmd
        self._gres_watcher = gres_watcher
        self.actions = ("cleanup", "reconfigure") if gres_watcher is not None else ("cleanup",)
        self._lock = asyncio.Lock()  # one clean-up or reconfigure at a time

    async def run(self, action, params, client):
        async with self._lock:
            if action == "cleanup":
                return await asyncio.to_thread(self._clean_up)
            return await asyncio.to_thread(self._reconfigure)

    def _clean_up(self):
        from agent.hygiene import processes

        node = self._node_name
        running = (lambda: host.running_job_ids(node)) if self._slurm else (lambda: None)
        result = processes.clean_up(running_job_ids=running,
                                    grace_s=self._settings.job_cleanup_grace_s)
        log.warning("clean-up asked by the server: %s", result["message"])
        return result["message"]

    @property
    def _slurm(self):
        return self._gres_watcher is not None

    def _reconfigure(self):
        from agent.hygiene import gres

        watcher = self._gres_watcher
        try:
            result = gres.reconfigure(
                node_name=self._node_name, gpus=watcher.read_gpus(), gres_conf=watcher.gres_conf,
                device_dir=self._settings.gpu_device_dir,
                restart_slurmd=lambda: self._slurmd.restart_now("reconfigure"))
        except gres.ReconfigureFailed as exc:
            raise CommandFailed(str(exc)) from exc
        finally:
            self._compare_again()
        log.warning("reconfigure asked by the server: %s", result["message"])
        return result["message"]

    def _compare_again(self):
        """gres_drift opens, changes or clears with the watcher's next poll, not minutes later."""
        try:
            self._gres_watcher.check_now()
        except host.SlurmError as exc:
            log.warning("comparing Slurm's GPUs after the reconfigure failed: %s", exc)


def make_hygiene(config, nvml=None, *, read_gpus=None):
    """The started Hygiene for this node (close its watchers with the others'), or none
    with hygiene off. nvml: the NVML module the node's GPUs are read through; read_gpus:
    the GPUs in gres.nvml_gpus()'s shape where they are not (default: NVML's)."""
    if config.hygiene.enabled is False:
        return Hygiene()
    return _watching(config, nvml, read_gpus)


def _watching(config, nvml, read_gpus):
    """The real watchers, started."""
    from agent.hygiene.gres import GresWatcher, nvml_gpus
    from agent.hygiene.job_cleanup import LeftoversWatcher
    from agent.hygiene.processes import ProcessWatcher
    from agent.hygiene.slurmd import SlurmdWatcher

    settings = config.hygiene
    node = config.node_name
    slurm = shutil.which("scontrol") is not None
    processes = ProcessWatcher(
        running_job_ids=(lambda: host.running_job_ids(node)) if slurm else (lambda: None),
        zombie_threshold=settings.zombie_threshold, pid_pressure_pct=settings.pid_pressure_pct,
        interval_s=settings.process_check_interval_s)
    watchers, parts = [processes], {"processes": processes.status}
    slurmd = gres_watcher = None
    if slurm:
        slurmd = SlurmdWatcher(
            node_name=node, unit=settings.slurmd_unit, pid_file=settings.slurmd_pid_file,
            restart_command=settings.slurmd_restart_command, restart=settings.slurmd_restart,
            flap_count=settings.slurmd_flap_count, flap_window_s=settings.slurmd_flap_window_s)
        device_dir = settings.gpu_device_dir
        read = read_gpus or (lambda: nvml_gpus(nvml, device_dir=device_dir))
        gres_watcher = GresWatcher(node_name=node, read_gpus=read,
                                   gres_conf=settings.gres_conf,
                                   interval_s=settings.gres_check_interval_s)
        watchers += [slurmd, gres_watcher]
        parts.update(slurmd=slurmd.status, gres=gres_watcher.status)
        if nvml is not None:
            watchers.append(LeftoversWatcher(state_dir=config.state_dir, nvml=nvml))
    for watcher in watchers:
        watcher.start()
    commands = HygieneCommands(node_name=node, settings=settings, slurmd=slurmd,
                               gres_watcher=gres_watcher)
    return Hygiene(watchers=watchers, parts=parts, commands=commands)
