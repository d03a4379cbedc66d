"""Slurm's GPUs against the hardware, and the repair that makes them agree again.

A node whose gres.conf names fewer GPUs than it has, or whose slurm.conf Gres count is
lower, runs jobs on fewer GPUs than it has (or none: Slurm 22.05 marks a node INVAL and
DRAIN when slurmd reports fewer GPUs than slurm.conf configures, with the reason "gres/gpu
count reported lower than configured (7 < 8)"; the node's Gres field keeps showing the
configured count). The GresWatcher compares, every
`interval_s` seconds (300) in a thread:

- NVML's GPUs (index, uuid, minor number, and the device file /dev/nvidia<minor>);
- the Gres field of `scontrol show node <name> -o` (the controller's GPU count);
- this node's Name=gpu lines in gres.conf: their File= device paths, unless the node
  detects its GPUs itself (AutoDetect=nvml), and the device files themselves;
- and whether Slurm marked the node invalid, or drained it, for a low GPU count.

A difference is a `gres_drift` event (warning, no GPU) with every problem in its detail,
sent again only when the problems change, and `cleared` once they are gone. A failing
scontrol (slurmctld down) changes nothing; it is logged once.

reconfigure() is the repair. What Slurm 22.05 does, found with real daemons
(tests/test_agent_hygiene_slurm.py):

- slurmctld refuses `scontrol update NodeName=<node> Gres=gpu:<n>` with a count other than
  the one it has ("Attempt to change gres/gpu Count on node ... invalid with File
  configuration"), whether slurmd is up or down, before or after its restart; the same
  count is accepted and changes nothing. The controller's count comes from slurm.conf's
  NodeName line, and slurmd itself ignores gres.conf GPUs beyond that count. So a count
  that differs is tried first, before anything on the node is touched, and its refusal
  fails the repair with what to change in slurm.conf.
- slurmd reads gres.conf when it starts: after the rewrite it is restarted. The node
  registers with the new count and loses INVALID_REG, but keeps the DRAIN Slurm set, with
  its reason, until `scontrol update NodeName=<node> State=RESUME` (refused while the node
  is still INVAL). Only a drain whose reason is Slurm's own low-GPU-count one is resumed.
"""

import json
import logging
import os
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass

from agent import host
from agent.detectors.polling import PollingWatcher
from agent.protocol import MESSAGE_LIMIT, event_frame, truncated

log = logging.getLogger(__name__)

GRES_INTERVAL_S = 300.0
SCONTROL_TIMEOUT_S = 15
VERIFY_WAIT_S = 20.0  # slurmd registers with slurmctld a moment after it starts
DEFAULT_GRES_CONF = "/etc/slurm/gres.conf"
BACKUP_SUFFIX = ".clusterui-backup"
DETAIL_LIMIT_BYTES = 16 * 1024
# Slurm's own reason when slurmd reports fewer GPUs than slurm.conf configures (22.05;
# older versions said "count too low").
SLURM_LOW_GPU_REASON = re.compile(r"gres/gpu count (reported lower than configured|too low)")
# The "[user@time]" scontrol appends to a reason.
REASON_SUFFIX = re.compile(r"\s*\[[^\]@]*@[^\]]*\]$")
COUNT_SUFFIXES = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}


class ReconfigureFailed(Exception):
    """The repair did not make Slurm's view match; str() says why and what remains."""


# --- NVML ------------------------------------------------------------------------------------


def nvml_gpus(nvml, *, device_dir="/dev"):
    """[{"index", "uuid", "minor", "device"}] for every GPU NVML sees (NVML initialized)."""
    gpus = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = nvml.nvmlDeviceGetUUID(handle)
        if isinstance(uuid, bytes):  # older pynvml
            uuid = uuid.decode()
        minor = nvml.nvmlDeviceGetMinorNumber(handle)
        gpus.append({"index": index, "uuid": uuid, "minor": minor,
                     "device": os.path.join(device_dir, f"nvidia{minor}")})
    return gpus


# --- scontrol --------------------------------------------------------------------------------


def simulated_gpus(backend, *, device_dir="/dev"):
    """A simulated node's GPUs in nvml_gpus()'s shape, their minor numbers their indexes
    (as on the real H200: GPU 0 is minor 0), beside this machine's real Slurm (tests)."""
    return [{"index": gpu["index"], "uuid": gpu["uuid"], "minor": gpu["index"],
             "device": f"{device_dir}/nvidia{gpu['index']}"} for gpu in backend.gpus()]


def scontrol(*args):
    """scontrol's stdout; raises host.SlurmError when it is missing, fails or hangs."""
    argv = ["scontrol", *args]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S,
                                stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise host.SlurmError(f"{shlex.join(argv)} failed: {exc}") from exc
    if result.returncode != 0:
        raise host.SlurmError(f"{shlex.join(argv)} failed: "
                              f"{(result.stderr or result.stdout).strip()}")
    return result.stdout


def expand_hostlist(expression):
    """"gpu-[001-003],gpu-010" -> each name; "/dev/nvidia[0-3]" -> each path
    (`scontrol show hostnames` expands any bracketed list)."""
    if "[" not in expression:
        return [part for part in expression.split(",") if part]
    return scontrol("show", "hostnames", expression).split()


def compress_hostlist(names):
    """The names as one Slurm hostlist ("gpu-[002-004]"), by `scontrol show hostlist`."""
    return scontrol("show", "hostlist", ",".join(names)).strip()


# --- Gres strings ----------------------------------------------------------------------------


def split_gres(gres):
    """"gpu:h200:4(S:0-1),mps:400" -> ["gpu:h200:4(S:0-1)", "mps:400"]; "(null)" -> []."""
    if not gres or gres == "(null)":
        return []
    entries, depth, current = [], 0, ""
    for char in gres:
        if char == "," and depth == 0:
            entries.append(current)
            current = ""
            continue
        depth += {"(": 1, ")": -1}.get(char, 0)
        current += char
    return [entry for entry in entries + [current] if entry]


def parse_gres_entry(entry):
    """"gpu:h200:8(S:0-1)" -> ("gpu", "h200", 8); "gpu:8" -> ("gpu", None, 8);
    "gpu" -> ("gpu", None, 1); "mps:100K" -> ("mps", None, 102400)."""
    parts = entry.split("(", 1)[0].split(":")
    name, gres_type, count = parts[0], None, "1"
    if len(parts) == 2:
        if _is_count(parts[1]):
            count = parts[1]
        else:
            gres_type = parts[1]
    elif len(parts) >= 3:
        gres_type, count = parts[1], parts[2]
    if not _is_count(count):
        raise ValueError(f"not a Gres entry: {entry!r}")
    number, suffix = re.fullmatch(r"(\d+)([KMGTP]?)", count.upper()).groups()
    return name, gres_type, int(number) * COUNT_SUFFIXES[suffix]


def _is_count(text):
    return re.fullmatch(r"\d+[KMGTPkmgtp]?", text) is not None


def gres_gpu_count(gres):
    """The GPUs a Gres string gives (the sum over its gpu entries; 0 for "(null)")."""
    return sum(count for name, _, count in map(parse_gres_entry, split_gres(gres))
               if name == "gpu")


def gres_with_gpu_count(gres, count):
    """The Gres string for `scontrol update`: the GPU entries replaced by one with `count`
    (the first one's type kept), the other kinds kept, without the socket suffixes
    ("(S:0-1)") that scontrol shows but does not take."""
    entries, gpu_written = [], False
    for entry in split_gres(gres):
        name, gres_type, _ = parse_gres_entry(entry)
        if name != "gpu":
            entries.append(entry.split("(", 1)[0])
        elif not gpu_written:
            gpu_written = True
            entries.append(f"gpu:{gres_type}:{count}" if gres_type else f"gpu:{count}")
    if not gpu_written:
        entries.append(f"gpu:{count}")
    return ",".join(entries)


# --- gres.conf -------------------------------------------------------------------------------


def default_gres_conf_path():
    """gres.conf beside $SLURM_CONF, else /etc/slurm/gres.conf."""
    slurm_conf = os.environ.get("SLURM_CONF")
    if slurm_conf:
        return os.path.join(os.path.dirname(slurm_conf), "gres.conf")
    return DEFAULT_GRES_CONF


def gres_conf_fields(line):
    """{lowercased key: value} of one gres.conf line, or None for a comment or blank line."""
    text = line.split("#", 1)[0].strip()
    if not text:
        return None
    try:
        tokens = shlex.split(text)
    except ValueError:  # an unbalanced quote: take the words as they are
        tokens = text.split()
    fields = {}
    for token in tokens:
        key, sep, value = token.partition("=")
        if sep:
            fields[key.lower()] = value
    return fields


def is_gpu_line(fields):
    return fields is not None and fields.get("name", "").lower() == "gpu"


def line_files(fields):
    value = fields.get("file") or fields.get("files")
    return [] if not value else expand_hostlist(value)


def read_gres_conf(path, node_name):
    """This node's part of gres.conf: {"exists", "autodetect" (the node's own AutoDetect,
    else the global one, lowercased; None when unset), "files" (its GPU device paths)}.
    A line applies to the node when its NodeName= names it or it has no NodeName=."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return {"exists": False, "autodetect": None, "files": []}
    global_autodetect = node_autodetect = None
    files = []
    for line in lines:
        fields = gres_conf_fields(line)
        if fields is None:
            continue
        nodes = fields.get("nodename")
        if nodes is not None and node_name not in expand_hostlist(nodes):
            continue
        if "autodetect" in fields:
            if nodes is None:
                global_autodetect = fields["autodetect"].lower()
            else:
                node_autodetect = fields["autodetect"].lower()
        if is_gpu_line(fields):
            files += [os.path.normpath(file) for file in line_files(fields)]
    return {"exists": True, "autodetect": node_autodetect or global_autodetect,
            "files": files}


def device_ranges(minors):
    """[0, 1, 2, 3, 5] -> "[0-3,5]"; [4] -> "4"."""
    minors = sorted(set(minors))
    runs = []
    for minor in minors:
        if runs and minor == runs[-1][1] + 1:
            runs[-1][1] = minor
        else:
            runs.append([minor, minor])
    if len(minors) == 1:
        return str(minors[0])
    return "[" + ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) + "]"


def rewrite_gres_conf(text, *, node_name, gpus, device_dir):
    """gres.conf's text with this node's GPU lines replaced by one from NVML:
    `NodeName=<node> Name=gpu [Type=<the old line's>] File=<device_dir>/nvidia[...]`.

    The node leaves every Name=gpu line whose NodeName= names it (the rest of the list
    stays, recompressed; a line left with no node goes); a Name=gpu line without NodeName=
    is taken as this node's (a per-node gres.conf) and goes. The new line takes the place
    of the first line the node left. Every other line, comment and gres kind stays as it
    was."""
    kept = []
    new_line_at = None
    gpu_type = None
    for line in text.splitlines(keepends=True):
        fields = gres_conf_fields(line)
        if not is_gpu_line(fields):
            kept.append(line)
            continue
        nodes_value = fields.get("nodename")
        if nodes_value is not None:
            nodes = expand_hostlist(nodes_value)
            if node_name not in nodes:
                kept.append(line)
                continue
            others = [name for name in nodes if name != node_name]
            if others:
                kept.append(_with_node_names(line, compress_hostlist(others)))
        if gpu_type is None and fields.get("type"):
            gpu_type = fields["type"]
        if new_line_at is None:
            new_line_at = len(kept)
    type_part = f" Type={gpu_type}" if gpu_type else ""
    files = os.path.join(device_dir, "nvidia") + device_ranges(gpu["minor"] for gpu in gpus)
    new_line = f"NodeName={node_name} Name=gpu{type_part} File={files}\n"
    if new_line_at is None:
        if kept and not kept[-1].endswith("\n"):
            kept[-1] += "\n"
        new_line_at = len(kept)
    kept.insert(new_line_at, new_line)
    return "".join(kept)


def _with_node_names(line, names):
    """The line with its NodeName= value replaced, the rest as it was."""
    code, hash_, comment = line.partition("#")
    code = re.sub(r'(?i)(^|\s)(NodeName=)("[^"]*"|\S+)',
                  lambda m: m.group(1) + m.group(2) + names, code, count=1)
    return code + hash_ + comment


def write_gres_conf(path, text):
    """Replace the file atomically (a temporary file in its folder, then os.replace),
    with its mode and owner, keeping the previous one as <path>.clusterui-backup. A
    symlinked gres.conf is written where the link points."""
    target = os.path.realpath(path)
    try:
        old = os.stat(target)
    except FileNotFoundError:
        old = None
    if old is not None:
        shutil.copy2(target, target + BACKUP_SUFFIX)
    fd, temporary = tempfile.mkstemp(dir=os.path.dirname(target), prefix=".gres.conf.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temporary, stat.S_IMODE(old.st_mode) if old is not None else 0o644)
        if old is not None and os.geteuid() == 0:
            os.chown(temporary, old.st_uid, old.st_gid)
        os.replace(temporary, target)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


# --- Slurm's view and the comparison ---------------------------------------------------------


def slurm_view(node_name, *, gres_conf=None):
    """Slurm's view of this node's GPUs: {"node", "gres" (the Gres field as scontrol shows
    it), "gres_gpus", "state", "reason", "gres_conf" (path), "gres_conf_exists",
    "autodetect", "files"}. Raises host.SlurmError when scontrol fails."""
    fields = host.parse_scontrol_line(scontrol("show", "node", node_name, "-o").strip())
    gres = fields.get("Gres") or "(null)"
    path = gres_conf or default_gres_conf_path()
    conf = read_gres_conf(path, node_name)
    return {
        "node": node_name,
        "gres": gres,
        "gres_gpus": gres_gpu_count(gres),
        "state": fields.get("State"),
        "reason": fields.get("Reason") or None,
        "gres_conf": path,
        "gres_conf_exists": conf["exists"],
        "autodetect": conf["autodetect"],
        "files": conf["files"],
    }


def slurm_low_gpu_mark(view):
    """"invalid" or "drained" when Slurm marked the node so for a low GPU count (its own
    reason), else None."""
    if not SLURM_LOW_GPU_REASON.match(view.get("reason") or ""):
        return None
    flags = (view.get("state") or "").upper().split("+")
    if "INVALID_REG" in flags or "INVAL" in flags:
        return "invalid"
    if "DRAIN" in flags:
        return "drained"
    return None


def gpus_text(count):
    return f"{count} GPU" if count == 1 else f"{count} GPUs"


@dataclass
class Comparison:
    match: bool
    problems: list
    nvml: list
    slurm: dict

    def compares_files(self):
        return self.slurm.get("autodetect") != "nvml"

    def headline(self):
        """The difference in a few words, for an event's message."""
        seen = len(self.nvml)
        files = sorted(set(self.slurm.get("files", [])))
        if self.compares_files() and len(files) != seen:
            return f"gres.conf names {gpus_text(len(files))}, NVML sees {seen}"
        if self.slurm.get("gres_gpus") != seen:
            return f"Slurm's Gres says {gpus_text(self.slurm.get('gres_gpus'))}, NVML sees {seen}"
        return self.problems[0] if self.problems else "no difference"

    def to_detail(self):
        """{"problems", "nvml", "slurm"} for an event: strings cut to the protocol's limit,
        the lists shortened (and "truncated": true) to stay under 16 KiB of JSON."""
        problems = [truncated(p, MESSAGE_LIMIT) for p in self.problems]
        nvml = list(self.nvml)
        files = list(self.slurm.get("files", []))
        slurm = {key: truncated(value, MESSAGE_LIMIT) for key, value in self.slurm.items()
                 if key != "files"}
        cut = False
        while True:
            detail = {"problems": problems, "nvml": nvml,
                      "slurm": {**slurm, "files": [truncated(f, MESSAGE_LIMIT) for f in files]}}
            if cut:
                detail["truncated"] = True
            longest = max((problems, nvml, files), key=len)
            # Without the lists the rest is a few short values: always under the limit.
            if len(json.dumps(detail)) <= DETAIL_LIMIT_BYTES or not longest:
                return detail
            del longest[len(longest) // 2:]
            cut = True


def compare(gpus, view):
    """NVML's GPUs (nvml_gpus) against Slurm's view (slurm_view): a Comparison whose
    problems are short sentences, in a stable order."""
    problems = []
    node = view.get("node") or "the node"
    if view["gres_gpus"] != len(gpus):
        problems.append(f"Slurm's Gres says {gpus_text(view['gres_gpus'])}, NVML sees {len(gpus)}")
    devices = [os.path.normpath(gpu["device"]) for gpu in gpus]
    if view.get("autodetect") != "nvml":
        files = view["files"]
        for gpu, device in zip(gpus, devices):
            if device not in files:
                problems.append(f"gres.conf has no line for {device} "
                                f"(GPU {gpu['index']}, {gpu['uuid']})")
        for path in dict.fromkeys(files):
            if path not in devices:
                problems.append(f"gres.conf names {path}, which no GPU has")
    for device in devices:
        if not os.path.exists(device):
            problems.append(f"the device file {device} is missing")
    mark = slurm_low_gpu_mark(view)
    if mark is not None:
        reason = REASON_SUFFIX.sub("", view["reason"])
        what = "marked {} invalid" if mark == "invalid" else "drained {}"
        problems.append(f"Slurm {what.format(node)}: {reason}")
    return Comparison(match=not problems, problems=problems, nvml=list(gpus), slurm=dict(view))


# --- the watcher -----------------------------------------------------------------------------


class GresWatcher(PollingWatcher):
    thread_name = "gres"

    def __init__(self, *, node_name, read_gpus, gres_conf=None, interval_s=GRES_INTERVAL_S):
        """read_gpus() -> the node's GPUs as nvml_gpus() gives them (or simulated_gpus())."""
        super().__init__(interval_s)
        self.node_name = node_name
        self.read_gpus = read_gpus
        self.gres_conf = gres_conf
        self._lock = threading.Lock()
        self._open_problems = None  # the problems of the open gres_drift, if any
        self._status = None
        self._failing = False

    def status(self):
        """{"match", "nvml_gpus", "slurm_gpus", "checked_at"}, or None before a check."""
        return None if self._status is None else dict(self._status)

    def check_once(self):
        try:
            _, events = self._compare()
        except host.SlurmError as exc:
            if not self._failing:
                self._failing = True
                log.warning("%s (Slurm's GPUs are compared again every %g s)", exc,
                            self.interval_s)
            return []
        self._failing = False
        return events

    def check_now(self):
        """One comparison now: the Comparison; its event, if any, goes out with the next
        poll. Raises host.SlurmError when scontrol fails."""
        comparison, events = self._compare()
        for event in events:
            self._events.put(event)
        return comparison

    def _compare(self):
        with self._lock:
            gpus = self.read_gpus()
            comparison = compare(gpus, slurm_view(self.node_name, gres_conf=self.gres_conf))
            self._status = {
                "match": comparison.match,
                "nvml_gpus": len(gpus),
                "slurm_gpus": comparison.slurm["gres_gpus"],
                "checked_at": time.time(),
            }
            return comparison, self._edges(comparison)

    def _edges(self, comparison):
        if comparison.match:
            if self._open_problems is None:
                return []
            self._open_problems = None
            return [event_frame(
                signature="gres_drift", severity="info", state="cleared",
                message=f"Slurm's view of {self.node_name}'s GPUs matches the hardware again",
                detail=comparison.to_detail())]
        if comparison.problems == self._open_problems:
            return []
        self._open_problems = list(comparison.problems)
        return [event_frame(
            signature="gres_drift", severity="warning",
            message=(f"Slurm's view of {self.node_name}'s GPUs differs from the hardware: "
                     f"{comparison.headline()}"),
            detail=comparison.to_detail())]


# --- the repair ------------------------------------------------------------------------------


def reconfigure(*, node_name, gpus, gres_conf, device_dir, restart_slurmd):
    """Make Slurm's view of this node's GPUs (`gpus`, as nvml_gpus() gives them) match the
    hardware: rewrite gres.conf's GPU lines
    for the node (not on AutoDetect=nvml), restart slurmd (`restart_slurmd()` -> (ok,
    message)), have the controller take the count, resume Slurm's own low-GPU-count drain,
    and compare again for up to VERIFY_WAIT_S. Returns {"before", "after", "gres_conf",
    "gres", "message"}; raises ReconfigureFailed."""
    path = gres_conf or default_gres_conf_path()
    if not gpus:
        raise ReconfigureFailed(f"NVML sees no GPU on {node_name}: there is nothing to give "
                                f"Slurm")
    view = _view_or_fail(node_name, path)
    before = compare(gpus, view)
    new_gres = gres_with_gpu_count(view["gres"], len(gpus))
    if before.match:
        return {"before": [], "after": [], "gres_conf": path, "gres": view["gres"],
                "message": f"Slurm's view of {node_name}'s GPUs already matches the hardware"}
    missing = [gpu["device"] for gpu in gpus if not os.path.exists(gpu["device"])]
    if missing:
        raise ReconfigureFailed(
            f"the device files {', '.join(missing)} are missing: the driver has not made "
            f"them (nvidia-modprobe -c <minor>, or a reboot); gres.conf cannot fix that")

    done = []
    if view["gres_gpus"] != len(gpus):
        # Refused by Slurm 22.05 for GPUs with device files: tried before anything on the
        # node changes, so a refusal leaves the node as it was.
        try:
            scontrol("update", f"NodeName={node_name}", f"Gres={new_gres}")
        except host.SlurmError as exc:
            raise ReconfigureFailed(
                f"slurmctld refused Gres={new_gres} for {node_name} ({exc}); Slurm takes "
                f"this count from slurm.conf: set Gres={new_gres} on {node_name}'s NodeName "
                f"line there (controller and nodes), then restart slurmctld") from exc
        done.append(f"the controller's Gres set to {new_gres}")

    devices = {os.path.normpath(gpu["device"]) for gpu in gpus}
    if view["autodetect"] == "nvml":
        done.append("gres.conf left alone (AutoDetect=nvml)")
    elif set(view["files"]) != devices:
        try:
            with open(path) as f:
                old_text = f.read()
        except FileNotFoundError:
            old_text = ""
        except OSError as exc:
            raise ReconfigureFailed(f"cannot read {path}: {exc}") from exc
        try:
            new_text = rewrite_gres_conf(old_text, node_name=node_name, gpus=gpus,
                                         device_dir=device_dir)
        except host.SlurmError as exc:
            raise ReconfigureFailed(f"cannot rewrite {path}: {exc}") from exc
        if new_text != old_text:
            try:
                write_gres_conf(path, new_text)
            except OSError as exc:
                raise ReconfigureFailed(f"cannot write {path}: {exc}") from exc
            done.append(f"gres.conf rewritten for {gpus_text(len(gpus))}")

    ok, message = restart_slurmd()
    if not ok:
        raise ReconfigureFailed(f"{'; '.join(done) or 'nothing changed'}, but slurmd did not "
                                f"restart: {message}")
    done.append("slurmd restarted")

    after = _verify(node_name, gpus, path, done)
    if after:
        raise ReconfigureFailed(
            f"{'; '.join(done)}, but Slurm's view still differs after {VERIFY_WAIT_S:g} s: "
            f"{'; '.join(after)}")
    return {
        "before": before.problems,
        "after": [],
        "gres_conf": path,
        "gres": new_gres,
        "message": f"{'; '.join(done)}: Slurm's view of {node_name}'s GPUs matches the hardware",
    }


def _view_or_fail(node_name, path):
    try:
        return slurm_view(node_name, gres_conf=path)
    except host.SlurmError as exc:
        raise ReconfigureFailed(str(exc)) from exc


def _verify(node_name, gpus, path, done):
    """Compare until it matches or VERIFY_WAIT_S passed: the problems left. Resumes the
    node once, when it is drained (no longer invalid) for Slurm's own low-GPU reason, and
    waits out the moment after a resume when the node shows NOT_RESPONDING."""
    deadline = time.monotonic() + VERIFY_WAIT_S
    resumed = False
    while True:
        try:
            view = slurm_view(node_name, gres_conf=path)
        except host.SlurmError as exc:
            view, problems = None, [str(exc)]
        if view is not None and slurm_low_gpu_mark(view) == "drained" and not resumed:
            resumed = True
            try:
                scontrol("update", f"NodeName={node_name}", "State=RESUME")
                done.append(f"{node_name} resumed from Slurm's drain "
                            f"({REASON_SUFFIX.sub('', view['reason'])})")
            except host.SlurmError as exc:
                log.warning("resuming %s failed: %s", node_name, exc)
            continue
        if view is not None:
            problems = compare(gpus, view).problems
            settled = "NOT_RESPONDING" not in (view["state"] or "").upper().split("+")
            if not problems and (settled or time.monotonic() >= deadline):
                return []
        if time.monotonic() >= deadline:
            return problems
        time.sleep(0.2)
