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
scontrol (slurmctld down) changes nothing; it is logged once. The watcher does not know
at start whether the server holds a gres_drift open (from before an agent restart): its
first comparison that matches sends `cleared` (the server ignores a `cleared` with
nothing open), and so does check_now().

MIG: with a GPU in MIG mode Slurm counts the MIG slices as gpu (56 on 8 GPUs) and File=
names /dev/nvidia-caps devices, so NVML's GPUs cannot be compared with Slurm's. While any
GPU is in MIG mode nothing is compared (logged once; status() says match None and why in
"not_compared"), an open gres_drift is cleared, and reconfigure() refuses.

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
- gres.conf is often one file for the whole cluster (NFS, a symlink). A Name=gpu line
  without NodeName= applies to every node that reads the file, and Slurm adds a node's
  own NodeName= lines to it (checked with real daemons: `Name=gpu File=nvidia[0-6]` and
  `NodeName=<node> Name=gpu File=nvidia7` give that node 8 GPUs). The rewrite never
  changes such a line: the node's own line takes the devices the shared lines leave out,
  and when a shared line names a device this node does not have, the repair refuses with
  what to change by hand. Lines whose NodeName= lists this node among others lose this
  node (it gets a line of its own).
- Configless Slurm (SlurmctldParameters=enable_configless, or a node that reads its
  configuration from slurmctld: slurmd's conf-cache, /run/slurm/conf) has no local
  gres.conf to edit: the repair refuses where it would have to rewrite it.
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
from agent.connection.protocol import MESSAGE_LIMIT, event_frame, truncated
from agent.detectors.polling import PollingWatcher

log = logging.getLogger(__name__)

GRES_INTERVAL_S = 300.0
SCONTROL_TIMEOUT_S = 15
VERIFY_WAIT_S = 20.0  # slurmd registers with slurmctld a moment after it starts
DEFAULT_GRES_CONF = "/etc/slurm/gres.conf"
# Where configless slurmd keeps what slurmctld sent it (SlurmdSpoolDir/conf-cache) and the
# link to it that client commands read (/run/slurm/conf).
CONF_CACHE_FOLDER = "conf-cache"
RUN_SLURM_CONF = "/run/slurm/conf"
NVML_DEVICE_MIG_ENABLE = 1  # nvmlDeviceGetMigMode's current mode with MIG on
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
    """[{"index", "uuid", "minor", "device", "mig"}] for every GPU NVML sees (NVML
    initialized); "mig" is whether the GPU is in MIG mode now (mig_mode_on)."""
    gpus = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = nvml.nvmlDeviceGetUUID(handle)
        if isinstance(uuid, bytes):  # older pynvml
            uuid = uuid.decode()
        minor = nvml.nvmlDeviceGetMinorNumber(handle)
        gpus.append({"index": index, "uuid": uuid, "minor": minor,
                     "device": os.path.join(device_dir, f"nvidia{minor}"),
                     "mig": mig_mode_on(nvml, handle)})
    return gpus


def mig_mode_on(nvml, handle):
    """Whether the GPU is in MIG mode now (nvmlDeviceGetMigMode's current mode, not the
    pending one a reset would bring). A GPU without MIG answers NotSupported; an NVML or
    pynvml without the function (FunctionNotFound, no attribute) has no MIG either."""
    get_mig_mode = getattr(nvml, "nvmlDeviceGetMigMode", None)
    if get_mig_mode is None:
        return False
    no_mig = tuple(getattr(nvml, name) for name in
                   ("NVMLError_NotSupported", "NVMLError_FunctionNotFound")
                   if hasattr(nvml, name))
    try:
        current, _pending = get_mig_mode(handle)
    except no_mig:
        return False
    return current == NVML_DEVICE_MIG_ENABLE


def mig_problem(gpus):
    """Why Slurm's GPUs cannot be compared with these, when any is in MIG mode; else None."""
    mig = [gpu["index"] for gpu in gpus if gpu.get("mig")]
    if not mig:
        return None
    which = f"GPU {mig[0]}" if len(mig) == 1 else f"GPUs {', '.join(map(str, mig))}"
    return (f"MIG mode is on for {which}: Slurm counts MIG slices as gpu and names "
            f"/dev/nvidia-caps devices, so its GPUs cannot be compared with NVML's "
            f"{gpus_text(len(gpus))}")


# --- scontrol --------------------------------------------------------------------------------


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


def node_gpu_line(node_name, gpus, device_dir, gpu_type=None):
    """`NodeName=<node> Name=gpu [Type=<type>] File=<device_dir>/nvidia[...]` for `gpus`."""
    type_part = f" Type={gpu_type}" if gpu_type else ""
    files = os.path.join(device_dir, "nvidia") + device_ranges(gpu["minor"] for gpu in gpus)
    return f"NodeName={node_name} Name=gpu{type_part} File={files}"


def rewrite_gres_conf(text, *, node_name, gpus, device_dir):
    """gres.conf's text with this node's own GPU lines replaced by one from NVML:
    `NodeName=<node> Name=gpu [Type=<the old line's>] File=<device_dir>/nvidia[...]`.

    The node leaves every Name=gpu line whose NodeName= names it (the rest of the list
    stays, recompressed; a line left with no node goes). A Name=gpu line without NodeName=
    applies to every node reading the file (a shared gres.conf) and is never changed: the
    new line names only the devices those lines leave out (none: no new line), and when
    they name a device this node does not have, ReconfigureFailed says what to change by
    hand. The new line takes the place of the first line the node left, else it comes
    last. Every other line, comment and gres kind stays as it was."""
    lines = text.splitlines(keepends=True)
    devices = [os.path.normpath(gpu["device"]) for gpu in gpus]
    shared_files, shared_lines, shared_type = [], [], None
    for line in lines:
        fields = gres_conf_fields(line)
        if is_gpu_line(fields) and fields.get("nodename") is None:
            shared_files += [os.path.normpath(file) for file in line_files(fields)]
            shared_lines.append(line.strip())
            shared_type = shared_type or fields.get("type")
    foreign = [file for file in dict.fromkeys(shared_files) if file not in devices]
    if foreign:
        raise ReconfigureFailed(_shared_lines_message(node_name, gpus, device_dir,
                                                      shared_lines, foreign, shared_type))
    own_gpus = [gpu for gpu, device in zip(gpus, devices) if device not in shared_files]

    kept = []
    new_line_at = None
    gpu_type = None
    for line in lines:
        fields = gres_conf_fields(line)
        if not is_gpu_line(fields) or fields.get("nodename") is None:
            kept.append(line)
            continue
        nodes = expand_hostlist(fields["nodename"])
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
    if not own_gpus:
        return "".join(kept)
    new_line = node_gpu_line(node_name, own_gpus, device_dir, gpu_type or shared_type) + "\n"
    if new_line_at is None:
        if kept and not kept[-1].endswith("\n"):
            kept[-1] += "\n"
        new_line_at = len(kept)
    kept.insert(new_line_at, new_line)
    return "".join(kept)


def _shared_lines_message(node_name, gpus, device_dir, shared_lines, foreign, gpu_type):
    """What to do by hand when a shared Name=gpu line (no NodeName=) would have to change."""
    lines = "line" if len(shared_lines) == 1 else "lines"
    quoted = "; ".join(f"`{line}`" for line in shared_lines)
    return (f"gres.conf's Name=gpu {lines} without NodeName= ({quoted}) name "
            f"{', '.join(foreign)}, which {node_name} does not have; such a line applies to "
            f"every node that reads the file (a gres.conf shared by the cluster), so "
            f"rewriting it would change the other nodes' GPUs at their next slurmd restart. "
            f"Give {node_name} a line of its own "
            f"(`{node_gpu_line(node_name, gpus, device_dir, gpu_type)}`) "
            f"with NodeName= on the shared {lines} for the other nodes, or correct the "
            f"shared {lines} by hand; nothing was changed")


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
    """match: True, False, or None when nothing was compared (`not_compared` says why:
    a GPU in MIG mode)."""

    match: bool | None
    problems: list
    nvml: list
    slurm: dict
    not_compared: str | None = None

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
        """{"problems", "nvml", "slurm"} for an event (and "not_compared" when nothing was
        compared): strings cut to the protocol's limit, the lists shortened (and
        "truncated": true) to stay under 16 KiB of JSON."""
        problems = [truncated(p, MESSAGE_LIMIT) for p in self.problems]
        nvml = list(self.nvml)
        files = list(self.slurm.get("files", []))
        slurm = {key: truncated(value, MESSAGE_LIMIT) for key, value in self.slurm.items()
                 if key != "files"}
        cut = False
        while True:
            detail = {"problems": problems, "nvml": nvml,
                      "slurm": {**slurm, "files": [truncated(f, MESSAGE_LIMIT) for f in files]}}
            if self.not_compared is not None:
                detail["not_compared"] = truncated(self.not_compared, MESSAGE_LIMIT)
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


# GresWatcher's gres_drift before its first comparison: the server may hold one open from
# before the agent restarted.
UNKNOWN = "unknown"


class GresWatcher(PollingWatcher):
    thread_name = "gres"

    def __init__(self, *, node_name, read_gpus, gres_conf=None, interval_s=GRES_INTERVAL_S):
        """read_gpus() -> the node's GPUs as nvml_gpus() gives them."""
        super().__init__(interval_s)
        self.node_name = node_name
        self.read_gpus = read_gpus
        self.gres_conf = gres_conf
        self._lock = threading.Lock()
        # The problems of the open gres_drift; None when none is open; UNKNOWN at start.
        self._open_problems = UNKNOWN
        self._status = None
        self._failing = False
        self._mig_logged = False

    def status(self):
        """{"match", "nvml_gpus", "slurm_gpus", "checked_at", "not_compared"}, or None
        before a check. While a GPU is in MIG mode: match and slurm_gpus None, and
        not_compared says why (None otherwise)."""
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
        """One comparison now: the Comparison (match None when a GPU is in MIG mode); its
        event, if any, goes out with the next poll. Raises host.SlurmError when scontrol
        fails."""
        comparison, events = self._compare()
        for event in events:
            self._events.put(event)
        return comparison

    def _compare(self):
        with self._lock:
            gpus = self.read_gpus()
            why = mig_problem(gpus)
            if why is not None:
                comparison = Comparison(match=None, problems=[], nvml=list(gpus), slurm={},
                                        not_compared=why)
                if not self._mig_logged:
                    self._mig_logged = True
                    log.warning("Slurm's GPUs on %s are not compared: %s", self.node_name, why)
            else:
                self._mig_logged = False
                comparison = compare(gpus, slurm_view(self.node_name, gres_conf=self.gres_conf))
            self._status = {
                "match": comparison.match,
                "nvml_gpus": len(gpus),
                "slurm_gpus": comparison.slurm.get("gres_gpus"),
                "checked_at": time.time(),
                "not_compared": comparison.not_compared,
            }
            return comparison, self._edges(comparison)

    def _edges(self, comparison):
        """gres_drift's edges: active when the problems appear or change, `cleared` when
        they are gone or nothing can be compared (MIG), and at the first check whose
        comparison matches (or is not made) since the agent started."""
        if comparison.match is not False:
            if self._open_problems is None:
                return []
            if comparison.match is None:
                message = (f"Slurm's view of {self.node_name}'s GPUs is not compared: "
                           f"{comparison.not_compared}")
            elif self._open_problems is UNKNOWN:
                message = (f"Slurm's view of {self.node_name}'s GPUs matches the hardware "
                           f"(the first comparison since the agent started)")
            else:
                message = f"Slurm's view of {self.node_name}'s GPUs matches the hardware again"
            self._open_problems = None
            return [event_frame(
                signature="gres_drift", severity="info", state="cleared",
                message=truncated(message, MESSAGE_LIMIT), detail=comparison.to_detail())]
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
    hardware: rewrite gres.conf's GPU lines for the node (not on AutoDetect=nvml; never a
    shared line without NodeName=), have the controller take the count, restart slurmd
    (`restart_slurmd()` -> (ok, message)), resume Slurm's own low-GPU-count drain, and
    compare again for up to VERIFY_WAIT_S. Returns {"before", "after", "gres_conf",
    "gres", "message"}; raises ReconfigureFailed.

    Refused, with nothing changed: no GPU; a GPU in MIG mode; missing device files; a
    shared gres.conf line that would have to change; configless Slurm where gres.conf
    would have to change; a count slurmctld refuses. Every refusal comes before the
    first change."""
    path = gres_conf or default_gres_conf_path()
    plan = _plan(node_name, gpus, path, device_dir)
    if plan.before.match:
        return {"before": [], "after": [], "gres_conf": path, "gres": plan.view["gres"],
                "message": f"Slurm's view of {node_name}'s GPUs already matches the hardware"}
    done = _apply(node_name, gpus, plan, restart_slurmd)
    after = _verify(node_name, gpus, path, done)
    if after:
        raise ReconfigureFailed(
            f"{'; '.join(done)}, but Slurm's view still differs after {VERIFY_WAIT_S:g} s: "
            f"{'; '.join(after)}")
    return {
        "before": plan.before.problems,
        "after": [],
        "gres_conf": path,
        "gres": plan.new_gres,
        "message": f"{'; '.join(done)}: Slurm's view of {node_name}'s GPUs matches the hardware",
    }


@dataclass
class ReconfigurePlan:
    """What reconfigure() changes: Slurm's view before (`view`, compared: `before`), the
    controller's Gres after (`new_gres`), and gres.conf's text before and after (None when
    it is not rewritten)."""

    path: str
    view: dict
    before: Comparison
    new_gres: str
    old_text: str | None = None
    new_text: str | None = None

    @property
    def rewrite(self):
        return self.new_text is not None


def _plan(node_name, gpus, path, device_dir):
    """The ReconfigurePlan, every refusal first (ReconfigureFailed): a refusal leaves the
    node as it was. A plan whose `before` matches needs nothing done."""
    if not gpus:
        raise ReconfigureFailed(f"NVML sees no GPU on {node_name}: there is nothing to give "
                                f"Slurm")
    mig = mig_problem(gpus)
    if mig is not None:
        raise ReconfigureFailed(
            f"{mig}; this repair does not configure MIG: describe the MIG devices in "
            f"gres.conf by hand (or AutoDetect=nvml), then restart slurmd")
    view = _view_or_fail(node_name, path)
    plan = ReconfigurePlan(path=path, view=view, before=compare(gpus, view),
                           new_gres=gres_with_gpu_count(view["gres"], len(gpus)))
    if plan.before.match:
        return plan
    missing = [gpu["device"] for gpu in gpus if not os.path.exists(gpu["device"])]
    if missing:
        raise ReconfigureFailed(
            f"the device files {', '.join(missing)} are missing: the driver has not made "
            f"them (nvidia-modprobe -c <minor>, or a reboot); gres.conf cannot fix that")

    devices = {os.path.normpath(gpu["device"]) for gpu in gpus}
    if view["autodetect"] == "nvml" or set(view["files"]) == devices:
        return plan
    configless = configless_reason(path)
    if configless is not None:
        raise ReconfigureFailed(
            f"Slurm runs configless here ({configless}): {node_name} reads gres.conf "
            f"from slurmctld, there is no local gres.conf to edit. Correct {node_name}'s "
            f"GPU line in the controller's gres.conf "
            f"(`{node_gpu_line(node_name, gpus, device_dir)}`), then `scontrol "
            f"reconfigure`; nothing was changed")
    try:
        with open(path) as f:
            plan.old_text = f.read()
    except FileNotFoundError:
        plan.old_text = ""
    except OSError as exc:
        raise ReconfigureFailed(f"cannot read {path}: {exc}") from exc
    try:
        plan.new_text = rewrite_gres_conf(plan.old_text, node_name=node_name, gpus=gpus,
                                          device_dir=device_dir)
    except host.SlurmError as exc:
        raise ReconfigureFailed(f"cannot rewrite {path}: {exc}") from exc
    except ReconfigureFailed as exc:
        raise ReconfigureFailed(f"{path}: {exc}") from exc
    return plan


def _apply(node_name, gpus, plan, restart_slurmd):
    """Carry out the plan: the controller's count (tried first: Slurm 22.05 refuses it for
    GPUs with device files, and a refusal leaves the node as it was), gres.conf, slurmd's
    restart. What was done, one phrase each; raises ReconfigureFailed."""
    done = []
    if plan.view["gres_gpus"] != len(gpus):
        try:
            scontrol("update", f"NodeName={node_name}", f"Gres={plan.new_gres}")
        except host.SlurmError as exc:
            raise ReconfigureFailed(
                f"slurmctld refused Gres={plan.new_gres} for {node_name} ({exc}); Slurm takes "
                f"this count from slurm.conf: set Gres={plan.new_gres} on {node_name}'s "
                f"NodeName line there (controller and nodes), then restart slurmctld") from exc
        done.append(f"the controller's Gres set to {plan.new_gres}")

    if plan.view["autodetect"] == "nvml":
        done.append("gres.conf left alone (AutoDetect=nvml)")
    elif plan.rewrite and plan.new_text != plan.old_text:
        try:
            write_gres_conf(plan.path, plan.new_text)
        except OSError as exc:
            raise ReconfigureFailed(f"cannot write {plan.path}: {exc}") from exc
        done.append(f"gres.conf rewritten for {gpus_text(len(gpus))}")

    ok, message = restart_slurmd()
    if not ok:
        raise ReconfigureFailed(f"{'; '.join(done) or 'nothing changed'}, but slurmd did not "
                                f"restart: {message}")
    done.append("slurmd restarted")
    return done


def parse_show_config(text):
    """{key: value} of `scontrol show config` ("SlurmctldParameters     = (null)")."""
    config = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            config.setdefault(key.strip(), value.strip())
    return config


def configless_reason(path):
    """Why gres.conf cannot be edited on this node because Slurm runs configless, or None:
    SlurmctldParameters has enable_configless, or the node reads its configuration from
    slurmctld (gres.conf or scontrol's SLURM_CONF in slurmd's conf-cache, or no slurm.conf
    beside gres.conf while /run/slurm/conf exists). Raises ReconfigureFailed when scontrol
    cannot say."""
    try:
        config = parse_show_config(scontrol("show", "config"))
    except host.SlurmError as exc:
        raise ReconfigureFailed(f"cannot tell whether Slurm runs configless: {exc}") from exc
    parameters = [p.strip().lower() for p in config.get("SlurmctldParameters", "").split(",")]
    if "enable_configless" in parameters:
        return "SlurmctldParameters=enable_configless"
    for where in (path, config.get("SLURM_CONF")):
        if where and CONF_CACHE_FOLDER in os.path.realpath(where).split(os.sep):
            return f"{where} is slurmd's copy of slurmctld's configuration"
    beside = os.path.join(os.path.dirname(path), "slurm.conf")
    if not os.path.exists(beside) and os.path.isdir(RUN_SLURM_CONF):
        return (f"no {beside}, and slurmd keeps slurmctld's configuration in "
                f"{RUN_SLURM_CONF}")
    return None


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
