"""Slurm's GPUs against NVML's, and the gres.conf rewrite, against a fake `scontrol` on PATH.

The fake answers as Slurm 22.05's scontrol does here (tests/test_agent_hygiene_slurm.py
runs the same code against real daemons): `show hostnames` one name per line (any
bracketed list, device paths too), `show hostlist` compressed in the order given
("gpu-[004,001-002]"), `show node <name> -o` the line the test sets (or slurmctld's
"Unable to contact" failure), `show config` in Slurm's layout (SlurmctldParameters
(null) and SLURM_CONF from the environment, or what the test sets), and `update`, which
it records and answers as slurmctld does: a Gres count change refused ("Invalid generic
resource (gres) specification") when the test says so."""

import json
import logging
import os
import sys

import pytest

from agent.hygiene import gres as gres_module
from agent.hygiene.gres import (
    Comparison,
    GresWatcher,
    ReconfigureFailed,
    compare,
    gres_gpu_count,
    gres_with_gpu_count,
    nvml_gpus,
    parse_gres_entry,
    reconfigure,
    rewrite_gres_conf,
    slurm_view,
    write_gres_conf,
)
from agent.tests.fake_pynvml import FakeNvml

NODE_LINE = (
    "NodeName=gpu-001 Arch=x86_64 CoresPerSocket=48 CPUAlloc=0 CPUEfctv=192 CPUTot=192 "
    "CPULoad=0.52 AvailableFeatures=(null) ActiveFeatures=(null) Gres={gres} "
    "NodeAddr=gpu-001 NodeHostName=gpu-001 Version=22.05.8 OS=Linux 6.1.0-27-amd64 "
    "RealMemory=2063000 AllocMem=0 FreeMem=1980000 Sockets=2 Boards=1 State={state} "
    "ThreadsPerCore=2 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu "
    "BootTime=2026-11-29T09:12:44 SlurmdStartTime=2026-11-29T09:13:02 "
    "LastBusyTime=2026-11-29T14:01:57 CfgTRES=cpu=192,mem=2063000M,billing=192,gres/gpu=8 "
    "AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s "
    "ExtSensorsWatts=0 ExtSensorsTemp=n/s{reason}"
)
LOW_COUNT = "gres/gpu count reported lower than configured (7 < 8)"

FAKE_SCONTROL = r'''#!{python}
import os, re, shutil, sys
FOLDER = {folder!r}
def path(name):
    return os.path.join(FOLDER, name)
with open(path("calls"), "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\n")

def split_top(text):
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        depth += {{"[": 1, "]": -1}}.get(char, 0)
        current += char
    return [p for p in parts + [current] if p]

def expand(expression):
    names = []
    for part in split_top(expression):
        match = re.fullmatch(r"(.*?)\[([^\]]+)\](.*)", part)
        if not match:
            names.append(part)
            continue
        prefix, ranges, suffix = match.groups()
        for item in ranges.split(","):
            first, _, last = item.partition("-")
            for number in range(int(first), int(last or first) + 1):
                names.append(prefix + str(number).zfill(len(first)) + suffix)
    return names

def compress(names):
    groups = []  # [prefix, [[first, last, width]]] for runs of names with one prefix
    for name in names:
        match = re.fullmatch(r"(.*?)(\d+)", name)
        prefix, digits = match.groups() if match else (name, None)
        if digits is None:
            groups.append([name, None])
            continue
        number, width = int(digits), len(digits)
        if groups and groups[-1][0] == prefix and groups[-1][1] is not None:
            run = groups[-1][1][-1]
            if number == run[1] + 1 and width == run[2]:
                run[1] = number
            else:
                groups[-1][1].append([number, number, width])
        else:
            groups.append([prefix, [[number, number, width]]])
    out = []
    for prefix, runs in groups:
        if runs is None:
            out.append(prefix)
        elif len(runs) == 1 and runs[0][0] == runs[0][1]:
            out.append(prefix + str(runs[0][0]).zfill(runs[0][2]))
        else:
            out.append(prefix + "[" + ",".join(
                str(a).zfill(w) if a == b else str(a).zfill(w) + "-" + str(b).zfill(w)
                for a, b, w in runs) + "]")
    return ",".join(out)

args = sys.argv[1:]
if args[:2] == ["show", "hostnames"]:
    for name in expand(args[2]):
        print(name)
elif args[:2] == ["show", "hostlist"]:
    print(compress(args[2].split(",")))
elif args[:2] == ["show", "node"]:
    if not os.path.exists(path("node_line")):
        print("slurm_load_node error: Unable to contact slurm controller (connect failure)",
              file=sys.stderr)
        sys.exit(1)
    print(open(path("node_line")).read().strip())
elif args[:2] == ["show", "config"]:
    if os.path.exists(path("config")):
        print(open(path("config")).read().strip())
    else:
        print("Configuration data as of 2026-11-29T14:02:11")
        print("SlurmctldParameters     = (null)")
        print("SLURM_CONF              = " + os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf"))
        print("SlurmdPidFile           = /run/slurmd.pid")
elif args[0] == "update":
    if any(a.startswith("Gres=") for a in args):
        if os.path.exists(path("refuse_gres")):
            print("slurm_update error: Invalid generic resource (gres) specification",
                  file=sys.stderr)
            sys.exit(1)
        if os.path.exists(path("line_after_gres_update")):
            shutil.copy(path("line_after_gres_update"), path("node_line"))
    if "State=RESUME" in args and os.path.exists(path("line_after_resume")):
        shutil.copy(path("line_after_resume"), path("node_line"))
else:
    print("fake scontrol: unexpected " + " ".join(args), file=sys.stderr)
    sys.exit(2)
'''


def eight_gpus(dev):
    """The 8 GPUs of a FakeNvml, their device files in `dev`."""
    return nvml_gpus(FakeNvml(gpu_count=8), device_dir=str(dev))


def node_line(gres="gpu:h200:8(S:0-1)", state="IDLE", reason=None):
    suffix = f" Reason={reason} [slurm@2026-11-29T14:02:11]" if reason else ""
    return NODE_LINE.format(gres=gres, state=state, reason=suffix) + "\n"


class FakeScontrol:
    def __init__(self, folder):
        self.folder = folder
        script = folder / "scontrol"
        script.write_text(FAKE_SCONTROL.format(python=sys.executable, folder=str(folder)))
        script.chmod(0o755)

    def show(self, **line):
        (self.folder / "node_line").write_text(node_line(**line))

    def after(self, what, **line):
        """The node line once the controller took a Gres update or a resume."""
        (self.folder / f"line_after_{what}").write_text(node_line(**line))

    def fail(self):
        (self.folder / "node_line").unlink(missing_ok=True)

    def refuse_gres(self):
        (self.folder / "refuse_gres").write_text("")

    def config(self, **values):
        """`scontrol show config`'s answer from now on: these keys, in Slurm's layout."""
        (self.folder / "config").write_text(
            "Configuration data as of 2026-11-29T14:02:11\n"
            + "".join(f"{key:<24}= {value}\n" for key, value in values.items()))

    def calls(self):
        path = self.folder / "calls"
        return path.read_text().splitlines() if path.exists() else []

    def updates(self):
        return [call for call in self.calls() if call.startswith("update")]


@pytest.fixture
def scontrol(tmp_path, monkeypatch):
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return FakeScontrol(folder)


@pytest.fixture
def dev(tmp_path):
    folder = tmp_path / "dev"
    folder.mkdir()
    for minor in range(8):
        (folder / f"nvidia{minor}").write_text("")
    return folder


@pytest.fixture
def gres_conf(tmp_path, monkeypatch):
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "slurm.conf").write_text("ClusterName=test\n")
    monkeypatch.setenv("SLURM_CONF", str(etc / "slurm.conf"))
    # Whatever this machine has in /run/slurm, these tests say what configless slurmd left.
    monkeypatch.setattr(gres_module, "RUN_SLURM_CONF", str(tmp_path / "run-slurm-conf"))
    return etc / "gres.conf"


def gpus_of(dev, minors):
    return [{"index": i, "uuid": f"GPU-{i:08x}-0000-0000-0000-000000000000", "minor": minor,
             "device": f"{dev}/nvidia{minor}"} for i, minor in enumerate(minors)]


# --- Gres strings and NVML -------------------------------------------------------------------


@pytest.mark.parametrize("gres, gpus", [
    ("gpu:8", 8),
    ("gpu:h200:8", 8),
    ("gpu:h200:8(S:0-1)", 8),
    ("gpu:h200:8(S:0,1)", 8),
    ("(null)", 0),
    ("gpu", 1),
    ("gpu:a100:4(S:0),gpu:h100:4(S:1),mps:400", 8),
    ("mps:100K", 0),
])
def test_the_gpus_of_a_gres_string(gres, gpus):
    assert gres_gpu_count(gres) == gpus


def test_gres_entries_read_their_type_and_count():
    assert parse_gres_entry("gpu:h200:8(S:0-1)") == ("gpu", "h200", 8)
    assert parse_gres_entry("gpu:h200") == ("gpu", "h200", 1)
    assert parse_gres_entry("mps:100K") == ("mps", None, 102400)
    with pytest.raises(ValueError):
        parse_gres_entry("gpu:h200:lots")


@pytest.mark.parametrize("gres, new", [
    ("gpu:h200:7(S:0-1),mps:400(S:0-1)", "gpu:h200:8,mps:400"),
    ("gpu:7", "gpu:8"),
    ("(null)", "gpu:8"),
    ("mps:200,gpu:7", "mps:200,gpu:8"),
    ("gpu:a100:4,gpu:h100:3", "gpu:a100:8"),
])
def test_the_gres_string_for_scontrol_update(gres, new):
    assert gres_with_gpu_count(gres, 8) == new


def test_nvml_gpus_name_each_gpus_device_file():
    nvml = FakeNvml(gpu_count=8)

    gpus = nvml_gpus(nvml, device_dir="/dev")

    assert [g["index"] for g in gpus] == list(range(8))
    assert [g["device"] for g in gpus] == [f"/dev/nvidia{m}" for m in range(8)]
    assert gpus[0] == {"index": 0, "uuid": nvml.uuid(0), "minor": 0, "device": "/dev/nvidia0",
                       "mig": False}
    assert len({g["uuid"] for g in gpus}) == 8


def test_nvml_gpus_mark_the_gpus_in_mig_mode():
    nvml = FakeNvml(gpu_count=4)
    # nvmlDeviceGetMigMode -> [current, pending]: GPU 1 has MIG on; GPU 2 gets it at its
    # next reset (pending only); GPU 3 cannot do MIG.

    def mig_mode(handle):
        if handle.index == 3:
            raise nvml.NVMLError_NotSupported()
        return {0: [0, 0], 1: [1, 1], 2: [0, 1]}[handle.index]

    nvml.nvmlDeviceGetMigMode = mig_mode

    assert [g["mig"] for g in nvml_gpus(nvml)] == [False, True, False, False]

    def too_old(handle):
        raise nvml.NVMLError_FunctionNotFound()

    nvml.nvmlDeviceGetMigMode = too_old
    assert [g["mig"] for g in nvml_gpus(nvml)] == [False] * 4


# --- Slurm's view ----------------------------------------------------------------------------


TRICKY_GRES_CONF = """\
# GPU nodes: gres.conf shared by every node
AutoDetect=off
NodeName=gpu-[001-004] Name=gpu Type=h200 File=/dev/nvidia[0-6]   # 001 lost a line
NodeName=gpu-[001-004] Name=mps Count=800 File=/dev/nvidia[0-6]
NodeName=gpu-00[5-6] Name=gpu File=/dev/nvidia[0-7]
NodeName=gpu-001 Name=gpu Type=h200 File=/dev/nvidia9
NodeName=gpu-006 AutoDetect=nvml
"""


def test_slurm_view_reads_the_gres_field_and_this_nodes_gres_conf_lines(scontrol, gres_conf):
    scontrol.show(gres="gpu:h200:8(S:0-1)")
    gres_conf.write_text(TRICKY_GRES_CONF)

    view = slurm_view("gpu-001")

    assert view == {
        "node": "gpu-001",
        "gres": "gpu:h200:8(S:0-1)",
        "gres_gpus": 8,
        "state": "IDLE",
        "reason": None,
        "gres_conf": str(gres_conf),
        "gres_conf_exists": True,
        "autodetect": "off",
        "files": [f"/dev/nvidia{m}" for m in range(7)] + ["/dev/nvidia9"],
    }
    assert "show node gpu-001 -o" in scontrol.calls()
    assert "show hostnames gpu-[001-004]" in scontrol.calls()


def test_a_nodes_own_autodetect_wins_over_the_global_one(scontrol, gres_conf):
    scontrol.show()
    gres_conf.write_text(TRICKY_GRES_CONF)

    assert slurm_view("gpu-006")["autodetect"] == "nvml"
    assert slurm_view("gpu-005")["autodetect"] == "off"


def test_lines_without_nodename_and_comma_lists_apply(scontrol, gres_conf):
    scontrol.show()
    gres_conf.write_text("Name=gpu File=/dev/nvidia0,/dev/nvidia[1-2]\n"
                         "NodeName=gpu-001,gpu-009 Name=gpu File=/dev/nvidia3\n"
                         "NodeName=gpu-009 Name=gpu File=/dev/nvidia4\n")

    view = slurm_view("gpu-001")

    assert view["files"] == ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidia3"]
    assert view["autodetect"] is None


def test_a_missing_gres_conf_names_no_gpu(scontrol, gres_conf):
    scontrol.show()

    view = slurm_view("gpu-001", gres_conf=str(gres_conf.parent / "elsewhere.conf"))

    assert (view["gres_conf_exists"], view["files"]) == (False, [])


# --- the comparison --------------------------------------------------------------------------


def view_of(dev, minors, *, gres="gpu:8", autodetect="off", state="IDLE", reason=None):
    return {"node": "gpu-001", "gres": gres, "gres_gpus": gres_gpu_count(gres), "state": state,
            "reason": reason, "gres_conf": "/etc/slurm/gres.conf", "gres_conf_exists": True,
            "autodetect": autodetect, "files": [f"{dev}/nvidia{m}" for m in minors]}


def test_a_matching_node(dev):
    comparison = compare(gpus_of(dev, range(8)), view_of(dev, range(8)))

    assert comparison.match and comparison.problems == []


def test_one_gpu_missing_from_gres_conf_and_slurms_invalid_mark(dev):
    gpus = gpus_of(dev, range(8))
    view = view_of(dev, range(7), state="IDLE+DRAIN+INVALID_REG",
                   reason=f"{LOW_COUNT} [slurm@2026-11-29T14:02:11]")

    comparison = compare(gpus, view)

    assert not comparison.match
    assert comparison.problems == [
        f"gres.conf has no line for {dev}/nvidia7 (GPU 7, {gpus[7]['uuid']})",
        f"Slurm marked gpu-001 invalid: {LOW_COUNT}",
    ]
    assert comparison.headline() == "gres.conf names 7 GPUs, NVML sees 8"


def test_every_kind_of_difference_is_a_sentence(dev):
    (dev / "nvidia3").unlink()
    gpus = gpus_of(dev, range(8))
    view = view_of(dev, [0, 1, 2, 3, 4, 5, 6, 7, 9], gres="gpu:h200:7(S:0-1)",
                   state="IDLE+DRAIN", reason=LOW_COUNT)

    problems = compare(gpus, view).problems

    assert problems == [
        "Slurm's Gres says 7 GPUs, NVML sees 8",
        f"gres.conf names {dev}/nvidia9, which no GPU has",
        f"the device file {dev}/nvidia3 is missing",
        f"Slurm drained gpu-001: {LOW_COUNT}",
    ]


def test_autodetect_nodes_have_no_files_to_compare_and_foreign_drains_are_not_ours(dev):
    view = view_of(dev, [], autodetect="nvml", state="IDLE+DRAIN", reason="bad DIMM")

    assert compare(gpus_of(dev, range(8)), view).match


def test_the_detail_stays_under_16_kib_with_strings_cut(dev):
    gpus = gpus_of(dev, range(400))
    view = view_of(dev, [], reason="x" * 5000)

    detail = compare(gpus, view).to_detail()

    assert len(json.dumps(detail)) <= 16 * 1024
    assert detail["truncated"] is True
    assert len(detail["slurm"]["reason"]) == 1000
    assert detail["problems"][0] == "Slurm's Gres says 8 GPUs, NVML sees 400"
    small = compare(gpus_of(dev, range(8)), view_of(dev, range(7))).to_detail()
    assert set(small) == {"problems", "nvml", "slurm"} and len(small["nvml"]) == 8


# --- rewriting gres.conf ---------------------------------------------------------------------


def test_the_node_leaves_shared_lines_and_gets_one_line_of_its_own(scontrol, dev):
    new = rewrite_gres_conf(TRICKY_GRES_CONF, node_name="gpu-001",
                            gpus=gpus_of("/dev", range(8)), device_dir="/dev")

    assert new == """\
# GPU nodes: gres.conf shared by every node
AutoDetect=off
NodeName=gpu-[002-004] Name=gpu Type=h200 File=/dev/nvidia[0-6]   # 001 lost a line
NodeName=gpu-001 Name=gpu Type=h200 File=/dev/nvidia[0-7]
NodeName=gpu-[001-004] Name=mps Count=800 File=/dev/nvidia[0-6]
NodeName=gpu-00[5-6] Name=gpu File=/dev/nvidia[0-7]
NodeName=gpu-006 AutoDetect=nvml
"""
    assert "show hostlist gpu-002,gpu-003,gpu-004" in scontrol.calls()


SHARED_LINES = ("AutoDetect=off\n"
                "Name=gpu Type=h200 File=/dev/nvidia[0-3] Cores=0-47\n"
                "Name=gpu Type=h200 File=/dev/nvidia[4-5] Cores=48-95\n"
                "Name=mps Count=200 File=/dev/nvidia0\n")


def test_lines_without_nodename_are_kept_and_the_node_gets_only_the_rest(scontrol):
    # They apply to every node that reads the file (shared by NFS or a symlink): never
    # changed; the node's own line names the devices they leave out.
    text = SHARED_LINES + "NodeName=gpu-001 Name=gpu File=/dev/nvidia9\n"

    new = rewrite_gres_conf(text, node_name="gpu-001", gpus=gpus_of("/dev", range(8)),
                            device_dir="/dev")

    assert new == SHARED_LINES + "NodeName=gpu-001 Name=gpu Type=h200 File=/dev/nvidia[6-7]\n"
    assert rewrite_gres_conf(SHARED_LINES, node_name="gpu-001", gpus=gpus_of("/dev", range(6)),
                             device_dir="/dev") == SHARED_LINES


def test_a_line_without_nodename_naming_a_gpu_the_node_lacks_is_refused(scontrol):
    with pytest.raises(ReconfigureFailed) as failed:
        rewrite_gres_conf(SHARED_LINES, node_name="gpu-001",
                          gpus=gpus_of("/dev", [0, 1, 2, 3, 5, 6, 7]), device_dir="/dev")

    assert str(failed.value) == (
        "gres.conf's Name=gpu lines without NodeName= (`Name=gpu Type=h200 "
        "File=/dev/nvidia[0-3] Cores=0-47`; `Name=gpu Type=h200 File=/dev/nvidia[4-5] "
        "Cores=48-95`) name /dev/nvidia4, which gpu-001 does not have; such a line applies "
        "to every node that reads the file (a gres.conf shared by the cluster), so "
        "rewriting it would change the other nodes' GPUs at their next slurmd restart. "
        "Give gpu-001 a line of its own (`NodeName=gpu-001 Name=gpu Type=h200 "
        "File=/dev/nvidia[0-3,5-7]`) with NodeName= on the shared lines for the other "
        "nodes, or correct the shared lines by hand; nothing was changed")


def test_a_quoted_or_lowercase_nodename_and_a_node_without_a_gpu_line(scontrol):
    text = ('nodename="gpu-[001-002]" name=gpu file=/dev/nvidia0\n'
            "NodeName=gpu-009 Name=gpu File=/dev/nvidia0")

    assert rewrite_gres_conf(text, node_name="gpu-002", gpus=gpus_of("/dev", [4]),
                             device_dir="/dev") == (
        "nodename=gpu-001 name=gpu file=/dev/nvidia0\n"
        "NodeName=gpu-002 Name=gpu File=/dev/nvidia4\n"
        "NodeName=gpu-009 Name=gpu File=/dev/nvidia0")
    assert rewrite_gres_conf(text, node_name="gpu-005", gpus=gpus_of("/dev", [0, 1]),
                             device_dir="/dev").endswith(
        "File=/dev/nvidia0\nNodeName=gpu-005 Name=gpu File=/dev/nvidia[0-1]\n")
    assert rewrite_gres_conf("", node_name="gpu-005", gpus=gpus_of("/dev", [0]),
                             device_dir="/dev") == "NodeName=gpu-005 Name=gpu File=/dev/nvidia0\n"


def test_the_file_is_replaced_with_its_mode_and_a_backup(tmp_path):
    path = tmp_path / "gres.conf"
    path.write_text("old\n")
    path.chmod(0o640)

    write_gres_conf(str(path), "new\n")

    assert path.read_text() == "new\n"
    assert oct(path.stat().st_mode & 0o777) == oct(0o640)
    assert (tmp_path / "gres.conf.clusterui-backup").read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gres.conf",
                                                          "gres.conf.clusterui-backup"]


def test_a_symlinked_gres_conf_is_written_where_it_points(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "gres.conf").write_text("old\n")
    link = tmp_path / "gres.conf"
    link.symlink_to(shared / "gres.conf")

    write_gres_conf(str(link), "new\n")

    assert link.is_symlink() and (shared / "gres.conf").read_text() == "new\n"
    assert (shared / "gres.conf.clusterui-backup").read_text() == "old\n"


# --- the watcher -----------------------------------------------------------------------------


def test_drift_opens_is_resent_only_when_it_changes_and_clears(scontrol, gres_conf, dev):
    scontrol.show(gres="gpu:8")
    gres_conf.write_text(f"NodeName=gpu-001 Name=gpu File={dev}/nvidia[0-6]\n")
    nvml = FakeNvml(gpu_count=8)
    watcher = GresWatcher(
        node_name="gpu-001", read_gpus=lambda: nvml_gpus(nvml, device_dir=str(dev)))
    assert watcher.status() is None

    [drift] = watcher.check_once()
    assert watcher.check_once() == []
    assert (drift["signature"], drift["severity"], drift["state"], drift["gpu_uuid"]) == (
        "gres_drift", "warning", "active", None)
    assert drift["message"] == ("Slurm's view of gpu-001's GPUs differs from the hardware: "
                                "gres.conf names 7 GPUs, NVML sees 8")
    assert drift["detail"]["problems"] == [
        f"gres.conf has no line for {dev}/nvidia7 (GPU 7, {nvml.uuid(7)})"]
    assert drift["detail"]["slurm"]["gres"] == "gpu:8"
    status = watcher.status()
    assert {k: status[k] for k in ("match", "nvml_gpus", "slurm_gpus")} == {
        "match": False, "nvml_gpus": 8, "slurm_gpus": 8}

    scontrol.show(gres="gpu:8", state="IDLE+DRAIN+INVALID_REG", reason=LOW_COUNT)
    [changed] = watcher.check_once()
    assert changed["detail"]["problems"][-1] == f"Slurm marked gpu-001 invalid: {LOW_COUNT}"

    scontrol.show(gres="gpu:8")
    gres_conf.write_text(f"NodeName=gpu-001 Name=gpu File={dev}/nvidia[0-7]\n")
    [cleared] = watcher.check_once()
    assert (cleared["signature"], cleared["state"], cleared["severity"]) == (
        "gres_drift", "cleared", "info")
    assert cleared["message"] == "Slurm's view of gpu-001's GPUs matches the hardware again"
    assert watcher.check_once() == []
    assert watcher.status()["match"] is True and watcher.status()["not_compared"] is None


def test_after_an_agent_restart_the_first_matching_comparison_clears(scontrol, gres_conf, dev):
    # The server may hold a gres_drift open from the agent's last run.
    scontrol.show(gres="gpu:8")
    gres_conf.write_text(f"NodeName=gpu-001 Name=gpu File={dev}/nvidia[0-7]\n")
    watcher = GresWatcher(node_name="gpu-001", read_gpus=lambda: eight_gpus(dev))

    [cleared] = watcher.check_once()

    assert (cleared["signature"], cleared["state"], cleared["severity"]) == (
        "gres_drift", "cleared", "info")
    assert cleared["message"] == ("Slurm's view of gpu-001's GPUs matches the hardware (the "
                                  "first comparison since the agent started)")
    assert cleared["detail"]["problems"] == []
    assert watcher.check_once() == [] and watcher.check_now().match is True
    assert watcher.poll([]) == []


def test_check_now_at_start_clears_too(scontrol, gres_conf, dev):
    scontrol.show(gres="gpu:8")
    gres_conf.write_text(f"Name=gpu File={dev}/nvidia[0-7]\n")
    watcher = GresWatcher(node_name="gpu-001", read_gpus=lambda: eight_gpus(dev))

    assert watcher.check_now().match is True

    assert [(e["signature"], e["state"]) for e in watcher.poll([])] == [
        ("gres_drift", "cleared")]
    assert watcher.check_once() == []


def mig_gpus(dev, mig_on):
    """eight_gpus() with MIG on (nvmlDeviceGetMigMode current mode 1) for those indexes."""
    nvml = FakeNvml(gpu_count=8)
    nvml.nvmlDeviceGetMigMode = lambda handle: [int(handle.index in mig_on)] * 2
    return nvml_gpus(nvml, device_dir=str(dev))


def test_with_a_gpu_in_mig_mode_nothing_is_compared_and_an_open_drift_clears(
        scontrol, gres_conf, dev, caplog):
    caplog.set_level(logging.WARNING)
    # Slurm counts the MIG slices: 7 per GPU, File= on /dev/nvidia-caps.
    scontrol.show(gres="gpu:8")
    gres_conf.write_text(f"NodeName=gpu-001 Name=gpu File={dev}/nvidia[0-6]\n")
    mig_on = set()
    watcher = GresWatcher(node_name="gpu-001", read_gpus=lambda: mig_gpus(dev, mig_on))
    [drift] = watcher.check_once()
    assert drift["state"] == "active"

    mig_on.update(range(8))
    scontrol.show(gres="gpu:1g.18gb:56(S:0-1)")
    gres_conf.write_text("NodeName=gpu-001 AutoDetect=nvml\n")
    calls = len(scontrol.calls())
    [cleared] = watcher.check_once()

    assert (cleared["signature"], cleared["state"]) == ("gres_drift", "cleared")
    assert cleared["message"] == (
        "Slurm's view of gpu-001's GPUs is not compared: MIG mode is on for GPUs 0, 1, 2, 3, "
        "4, 5, 6, 7: Slurm counts MIG slices as gpu and names /dev/nvidia-caps devices, so "
        "its GPUs cannot be compared with NVML's 8 GPUs")
    assert cleared["detail"]["not_compared"] == cleared["message"].split(": ", 1)[1]
    status = watcher.status()
    assert {k: status[k] for k in ("match", "nvml_gpus", "slurm_gpus", "not_compared")} == {
        "match": None, "nvml_gpus": 8, "slurm_gpus": None,
        "not_compared": cleared["detail"]["not_compared"]}
    assert json.loads(json.dumps(status)) == status
    assert watcher.check_once() == [] and watcher.check_now().match is None
    assert len(scontrol.calls()) == calls  # Slurm not even asked
    [record] = caplog.records
    assert "not compared: MIG mode is on for GPUs 0, 1" in record.getMessage()

    # MIG off again: compared as before.
    mig_on.clear()
    scontrol.show(gres="gpu:8")
    gres_conf.write_text(f"NodeName=gpu-001 Name=gpu File={dev}/nvidia[0-6]\n")
    [again] = watcher.check_once()
    assert again["state"] == "active" and watcher.status()["match"] is False


def test_a_mig_node_at_start_clears_once(scontrol, gres_conf, dev):
    watcher = GresWatcher(node_name="gpu-001", read_gpus=lambda: mig_gpus(dev, {2}))

    [cleared] = watcher.check_once()

    assert cleared["state"] == "cleared"
    assert "MIG mode is on for GPU 2:" in cleared["message"]
    assert watcher.check_once() == []


def test_a_failing_scontrol_changes_nothing_and_is_logged_once(scontrol, gres_conf, dev, caplog):
    caplog.set_level(logging.WARNING)
    scontrol.show(gres="gpu:7")
    gres_conf.write_text(f"Name=gpu File={dev}/nvidia[0-7]\n")
    watcher = GresWatcher(
        node_name="gpu-001", read_gpus=lambda: eight_gpus(dev))
    [drift] = watcher.check_once()

    scontrol.fail()
    assert [watcher.check_once() for _ in range(3)] == [[]] * 3
    scontrol.show(gres="gpu:7")
    assert watcher.check_once() == []

    [record] = caplog.records
    assert "Unable to contact slurm controller" in record.getMessage()
    assert drift["message"].endswith("Slurm's Gres says 7 GPUs, NVML sees 8")


def test_check_now_returns_the_comparison_and_queues_its_event(scontrol, gres_conf, dev):
    scontrol.show(gres="gpu:8")
    gres_conf.write_text(f"Name=gpu File={dev}/nvidia[0-6]\n")
    watcher = GresWatcher(
        node_name="gpu-001", read_gpus=lambda: eight_gpus(dev))

    comparison = watcher.check_now()

    assert isinstance(comparison, Comparison) and not comparison.match
    assert [e["signature"] for e in watcher.poll([])] == ["gres_drift"]
    assert watcher.check_once() == []  # the same problems: not sent twice


# --- reconfigure -----------------------------------------------------------------------------


class FakeRestart:
    """restart_slurmd: what slurmd's restart changes in the controller's view."""

    def __init__(self, scontrol, ok=True, **line_after):
        self.scontrol, self.ok, self.line_after, self.calls = scontrol, ok, line_after, 0

    def __call__(self):
        self.calls += 1
        if not self.ok:
            return False, "restarting slurmd on gpu-001 failed: slurmd -N gpu-001 exited with status 1"
        if self.line_after:
            self.scontrol.show(**self.line_after)
        return True, "slurmd on gpu-001 restarted"


def test_reconfigure_rewrites_restarts_resumes_and_verifies(scontrol, gres_conf, dev):
    gres_conf.write_text(f"AutoDetect=off\nNodeName=gpu-00[1-2] Name=gpu File={dev}/nvidia[0-6]\n")
    gres_conf.chmod(0o600)
    scontrol.show(gres="gpu:8", state="IDLE+DRAIN+INVALID_REG", reason=LOW_COUNT)
    restart = FakeRestart(scontrol, gres="gpu:8", state="IDLE+DRAIN", reason=LOW_COUNT)
    scontrol.after("resume", gres="gpu:8", state="IDLE")
    nvml = FakeNvml(gpu_count=8)

    result = reconfigure(node_name="gpu-001", gpus=nvml_gpus(nvml, device_dir=str(dev)),
                         gres_conf=None, device_dir=str(dev), restart_slurmd=restart)

    assert result == {
        "before": [f"gres.conf has no line for {dev}/nvidia7 (GPU 7, {nvml.uuid(7)})",
                   f"Slurm marked gpu-001 invalid: {LOW_COUNT}"],
        "after": [],
        "gres_conf": str(gres_conf),
        "gres": "gpu:8",
        "message": ("gres.conf rewritten for 8 GPUs; slurmd restarted; gpu-001 resumed from "
                    f"Slurm's drain ({LOW_COUNT}): Slurm's view of gpu-001's GPUs matches "
                    "the hardware"),
    }
    assert gres_conf.read_text() == (f"AutoDetect=off\nNodeName=gpu-002 Name=gpu "
                                     f"File={dev}/nvidia[0-6]\n"
                                     f"NodeName=gpu-001 Name=gpu File={dev}/nvidia[0-7]\n")
    assert gres_conf.stat().st_mode & 0o777 == 0o600
    assert (gres_conf.parent / "gres.conf.clusterui-backup").exists()
    assert restart.calls == 1
    # Equal counts: no Gres update (Slurm 22.05 would refuse any other count anyway).
    assert scontrol.updates() == ["update NodeName=gpu-001 State=RESUME"]


def test_a_count_the_controller_refuses_fails_before_anything_changes(scontrol, gres_conf, dev):
    text = f"Name=gpu File={dev}/nvidia[0-7]\n"
    gres_conf.write_text(text)
    scontrol.show(gres="gpu:h200:7(S:0-1)")
    scontrol.refuse_gres()
    restart = FakeRestart(scontrol)

    with pytest.raises(ReconfigureFailed) as failed:
        reconfigure(node_name="gpu-001", gpus=eight_gpus(dev), gres_conf=None,
                    device_dir=str(dev), restart_slurmd=restart)

    assert str(failed.value).startswith(
        "slurmctld refused Gres=gpu:h200:8 for gpu-001 (scontrol update NodeName=gpu-001 "
        "Gres=gpu:h200:8 failed: slurm_update error: Invalid generic resource (gres) "
        "specification); Slurm takes this count from slurm.conf")
    assert gres_conf.read_text() == text and restart.calls == 0


def test_a_count_the_controller_takes_is_verified(scontrol, gres_conf, dev):
    gres_conf.write_text(f"Name=gpu File={dev}/nvidia[0-7]\n")
    scontrol.show(gres="gpu:7")
    scontrol.after("gres_update", gres="gpu:8")

    result = reconfigure(node_name="gpu-001", gpus=eight_gpus(dev), gres_conf=None,
                         device_dir=str(dev), restart_slurmd=FakeRestart(scontrol))

    assert result["gres"] == "gpu:8"
    assert result["message"].startswith("the controller's Gres set to gpu:8; slurmd restarted")
    assert scontrol.updates() == ["update NodeName=gpu-001 Gres=gpu:8"]


def test_a_slurmd_that_does_not_restart_fails_the_repair(scontrol, gres_conf, dev):
    gres_conf.write_text(f"Name=gpu File={dev}/nvidia[0-6]\n")
    scontrol.show(gres="gpu:8")

    with pytest.raises(ReconfigureFailed) as failed:
        reconfigure(node_name="gpu-001", gpus=eight_gpus(dev), gres_conf=None,
                    device_dir=str(dev), restart_slurmd=FakeRestart(scontrol, ok=False))

    assert str(failed.value) == (
        "gres.conf rewritten for 8 GPUs, but slurmd did not restart: restarting slurmd on "
        "gpu-001 failed: slurmd -N gpu-001 exited with status 1")


def test_a_view_that_still_differs_fails_with_what_remains(scontrol, gres_conf, dev, monkeypatch):
    monkeypatch.setattr(gres_module, "VERIFY_WAIT_S", 0.3)
    gres_conf.write_text(f"Name=gpu File={dev}/nvidia[0-6]\n")
    scontrol.show(gres="gpu:8", state="IDLE+DRAIN+INVALID_REG", reason=LOW_COUNT)

    with pytest.raises(ReconfigureFailed) as failed:
        reconfigure(node_name="gpu-001", gpus=eight_gpus(dev), gres_conf=None,
                    device_dir=str(dev), restart_slurmd=FakeRestart(scontrol))

    assert str(failed.value) == (
        "gres.conf rewritten for 8 GPUs; slurmd restarted, but Slurm's view still differs "
        f"after 0.3 s: Slurm marked gpu-001 invalid: {LOW_COUNT}")


def test_an_autodetect_node_keeps_its_gres_conf(scontrol, gres_conf, dev):
    text = "AutoDetect=nvml\n"
    gres_conf.write_text(text)
    scontrol.show(gres="gpu:8", state="IDLE+DRAIN", reason=LOW_COUNT)
    scontrol.after("resume", gres="gpu:8", state="IDLE")
    restart = FakeRestart(scontrol)

    result = reconfigure(node_name="gpu-001", gpus=eight_gpus(dev), gres_conf=None,
                         device_dir=str(dev), restart_slurmd=restart)

    assert gres_conf.read_text() == text and restart.calls == 1
    assert result["message"].startswith("gres.conf left alone (AutoDetect=nvml); slurmd restarted")


def test_a_matching_node_is_left_alone_and_missing_device_files_are_refused(scontrol, gres_conf,
                                                                          dev):
    gres_conf.write_text(f"Name=gpu File={dev}/nvidia[0-7]\n")
    scontrol.show(gres="gpu:8")
    restart = FakeRestart(scontrol)

    result = reconfigure(node_name="gpu-001", gpus=eight_gpus(dev), gres_conf=None,
                         device_dir=str(dev), restart_slurmd=restart)
    assert (result["before"], result["after"], restart.calls) == ([], [], 0)

    (dev / "nvidia5").unlink()
    with pytest.raises(ReconfigureFailed) as failed:
        reconfigure(node_name="gpu-001", gpus=eight_gpus(dev), gres_conf=None,
                    device_dir=str(dev), restart_slurmd=restart)
    assert str(failed.value).startswith(f"the device files {dev}/nvidia5 are missing")
    assert restart.calls == 0


def test_reconfigure_refuses_a_mig_node(scontrol, gres_conf, dev):
    gres_conf.write_text("AutoDetect=nvml\n")
    scontrol.show(gres="gpu:1g.18gb:56(S:0-1)")
    restart = FakeRestart(scontrol)

    with pytest.raises(ReconfigureFailed) as failed:
        reconfigure(node_name="gpu-001", gpus=mig_gpus(dev, {0, 1}), gres_conf=None,
                    device_dir=str(dev), restart_slurmd=restart)

    assert str(failed.value) == (
        "MIG mode is on for GPUs 0, 1: Slurm counts MIG slices as gpu and names "
        "/dev/nvidia-caps devices, so its GPUs cannot be compared with NVML's 8 GPUs; this "
        "repair does not configure MIG: describe the MIG devices in gres.conf by hand (or "
        "AutoDetect=nvml), then restart slurmd")
    assert scontrol.calls() == [] and restart.calls == 0


def test_a_shared_line_that_would_have_to_change_is_refused_before_anything_changes(
        scontrol, gres_conf, dev):
    # One gres.conf for the cluster; this node lost GPU 7 (NVML sees 7), and Slurm's count
    # differs too: neither the controller's count nor the shared line is touched.
    text = f"AutoDetect=off\nName=gpu File={dev}/nvidia[0-7]\n"
    gres_conf.write_text(text)
    scontrol.show(gres="gpu:8")
    restart = FakeRestart(scontrol)

    with pytest.raises(ReconfigureFailed) as failed:
        reconfigure(node_name="gpu-001", gpus=gpus_of(dev, range(7)), gres_conf=None,
                    device_dir=str(dev), restart_slurmd=restart)

    message = str(failed.value)
    assert message.startswith(
        f"{gres_conf}: gres.conf's Name=gpu line without NodeName= (`Name=gpu "
        f"File={dev}/nvidia[0-7]`) name {dev}/nvidia7, which gpu-001 does not have; such a "
        "line applies to every node that reads the file")
    assert f"(`NodeName=gpu-001 Name=gpu File={dev}/nvidia[0-6]`)" in message
    assert message.endswith("nothing was changed")
    assert gres_conf.read_text() == text
    assert not (gres_conf.parent / "gres.conf.clusterui-backup").exists()
    assert scontrol.updates() == [] and restart.calls == 0


def test_a_shared_line_is_kept_and_the_node_gets_the_gpus_it_leaves_out(scontrol, gres_conf,
                                                                        dev):
    gres_conf.write_text(f"AutoDetect=off\nName=gpu File={dev}/nvidia[0-6]\n")
    scontrol.show(gres="gpu:8", state="IDLE+DRAIN+INVALID_REG", reason=LOW_COUNT)
    scontrol.after("resume", gres="gpu:8", state="IDLE")
    restart = FakeRestart(scontrol, gres="gpu:8", state="IDLE+DRAIN", reason=LOW_COUNT)

    result = reconfigure(node_name="gpu-001", gpus=eight_gpus(dev), gres_conf=None,
                         device_dir=str(dev), restart_slurmd=restart)

    assert gres_conf.read_text() == (f"AutoDetect=off\nName=gpu File={dev}/nvidia[0-6]\n"
                                     f"NodeName=gpu-001 Name=gpu File={dev}/nvidia7\n")
    assert result["message"].startswith("gres.conf rewritten for 8 GPUs; slurmd restarted")


@pytest.mark.parametrize("where", ["enable_configless", "conf-cache", "run-slurm-conf"])
def test_configless_slurm_is_refused_where_gres_conf_would_change(scontrol, gres_conf, dev,
                                                                  tmp_path, where):
    text = f"NodeName=gpu-001 Name=gpu File={dev}/nvidia[0-6]\n"
    gres_conf.write_text(text)
    scontrol.show(gres="gpu:7")
    if where == "enable_configless":
        scontrol.config(SlurmctldParameters="idle_on_node_suspend,enable_configless",
                        SLURM_CONF="/etc/slurm/slurm.conf")
        why = "SlurmctldParameters=enable_configless"
    elif where == "conf-cache":
        cached = tmp_path / "spool" / "slurmd" / "conf-cache" / "slurm.conf"
        scontrol.config(SlurmctldParameters="(null)", SLURM_CONF=str(cached))
        why = f"{cached} is slurmd's copy of slurmctld's configuration"
    else:
        (gres_conf.parent / "slurm.conf").unlink()
        (tmp_path / "run-slurm-conf").mkdir()
        why = (f"no {gres_conf.parent / 'slurm.conf'}, and slurmd keeps slurmctld's "
               f"configuration in {tmp_path / 'run-slurm-conf'}")
    restart = FakeRestart(scontrol)

    with pytest.raises(ReconfigureFailed) as failed:
        reconfigure(node_name="gpu-001", gpus=eight_gpus(dev), gres_conf=None,
                    device_dir=str(dev), restart_slurmd=restart)

    assert str(failed.value) == (
        f"Slurm runs configless here ({why}): gpu-001 reads gres.conf from slurmctld, there "
        "is no local gres.conf to edit. Correct gpu-001's GPU line in the controller's "
        f"gres.conf (`NodeName=gpu-001 Name=gpu File={dev}/nvidia[0-7]`), then `scontrol "
        "reconfigure`; nothing was changed")
    assert gres_conf.read_text() == text
    assert scontrol.updates() == [] and restart.calls == 0
