"""The agent's wheelhouse: the agent's wheel and its dependencies' wheels, for GPU nodes that
cannot reach a package index. The console serves the folder at /agent/wheels/
(settings.CLUSTERUI_AGENT_WHEELHOUSE), and its install command pins each wheel's hash.

build() makes it, at install time (`manage.py build_agent_wheelhouse`):
- the agent's wheel from the repository's agent/ folder (agent/pyproject.toml), built with
  this virtualenv's setuptools and nothing fetched;
- for each target Python and machine, the wheels of what agent/requirements.txt pins for it
  (its markers evaluated for that target: pip download would evaluate them for the Python
  it runs on), binary only, through pip and its configured index;
- manifest.json: the agent's version, the requirement lines, and each file's sha256.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

AGENT_SOURCE = Path(settings.BASE_DIR) / "agent"
AGENT_DISTRIBUTION = "clusterui-agent"
MANIFEST = "manifest.json"
# The Pythons of the OSes GPU nodes run (RHEL 9: 3.9, Ubuntu 22.04: 3.10, 24.04: 3.12) and
# their machines; manylinux_2_28 wheels install on glibc 2.28 and later (RHEL 8 and later).
PYTHONS = ("3.9", "3.10", "3.11", "3.12", "3.13")
MACHINES = ("x86_64", "aarch64")
GLIBC = "2_28"


class WheelhouseError(Exception):
    """The wheelhouse cannot be built or read; the message says why."""


@dataclass(frozen=True)
class Target:
    python: str  # "3.11"
    machine: str  # "x86_64"

    def __str__(self):
        return f"cp{self.python.replace('.', '')}-{self.machine}"

    def marker_environment(self):
        return {"python_version": self.python, "python_full_version": f"{self.python}.0",
                "platform_machine": self.machine, "sys_platform": "linux",
                "platform_system": "Linux", "os_name": "posix",
                "implementation_name": "cpython", "platform_python_implementation": "CPython"}


def this_machine():
    """The target this server runs on (the tests install the agent here)."""
    return Target(f"{sys.version_info.major}.{sys.version_info.minor}", os.uname().machine)


def all_targets():
    return [Target(python, machine) for python in PYTHONS for machine in MACHINES]


def agent_requirements():
    """The requirement lines of agent/requirements.txt, comments left out."""
    lines = (AGENT_SOURCE / "requirements.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def run(command):
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise WheelhouseError(f"{' '.join(command[:5])} ... failed:\n{done.stderr[-3000:]}")


def build_agent_wheel(directory):
    """The agent's wheel in `directory` (an older one removed); returns its file name."""
    for old in directory.glob("clusterui_agent-*.whl"):
        old.unlink()
    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / "agent"
        shutil.copytree(AGENT_SOURCE, source,
                        ignore=shutil.ignore_patterns("tests", "__pycache__", "*.pyc"))
        run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-index",
             "--no-build-isolation", "--wheel-dir", str(directory), str(source)])
    (wheel,) = directory.glob("clusterui_agent-*.whl")
    return wheel.name


def download_dependencies(directory, target, requirements):
    """The wheels of `requirements` that hold for `target`, into `directory`."""
    environment = target.marker_environment()
    wanted = [str(Requirement(line)).split(";")[0] for line in requirements
              if Requirement(line).marker is None or Requirement(line).marker.evaluate(environment)]
    run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
         "--only-binary=:all:", "--implementation", "cp", "--python-version", target.python,
         "--platform", f"manylinux_{GLIBC}_{target.machine}", "--dest", str(directory),
         *wanted])


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build(directory, targets, *, log=print):
    """Build the wheelhouse in `directory` for `targets`; returns the manifest."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    requirements = agent_requirements()
    agent_wheel = build_agent_wheel(directory)
    log(f"built {agent_wheel}")
    for target in targets:
        download_dependencies(directory, target, requirements)
        log(f"dependencies for {target}")
    _, version, _, _ = parse_wheel_filename(agent_wheel)
    manifest = {"agent_version": str(version), "agent_wheel": agent_wheel,
                "requirements": requirements, "targets": [str(t) for t in targets],
                "files": {path.name: sha256_of(path) for path in sorted(directory.glob("*.whl"))}}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def read_manifest(directory=None):
    """The built wheelhouse's manifest, or None when none is built."""
    path = Path(directory or settings.CLUSTERUI_AGENT_WHEELHOUSE) / MANIFEST
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def pinned_requirements(manifest):
    """The install's requirement lines, each with every hash the wheelhouse holds for it (pip
    --require-hashes takes the wheel that fits the node). Raises WheelhouseError for a
    requirement the wheelhouse holds no wheel of."""
    hashes = {}
    for name, digest in manifest["files"].items():
        distribution, version, _, _ = parse_wheel_filename(name)
        hashes.setdefault((distribution, str(version)), []).append(digest)
    lines = [_pinned(f"{AGENT_DISTRIBUTION}=={manifest['agent_version']}",
                     hashes.get((AGENT_DISTRIBUTION, manifest["agent_version"])))]
    for line in manifest["requirements"]:
        requirement = Requirement(line)
        (specifier,) = requirement.specifier  # agent/requirements.txt pins each with ==
        key = (canonicalize_name(requirement.name), specifier.version)
        marker = f" ; {requirement.marker}" if requirement.marker else ""
        lines.append(_pinned(f"{requirement.name}=={specifier.version}{marker}", hashes.get(key)))
    return lines


def _pinned(requirement, digests):
    if not digests:
        raise WheelhouseError(f"the wheelhouse holds no wheel of {requirement}: run "
                              f"manage.py build_agent_wheelhouse")
    return requirement + "".join(f" --hash=sha256:{digest}" for digest in sorted(digests))


def wheel_path(name, directory=None):
    """The path of a wheel the manifest lists, or None (no other file is served)."""
    manifest = read_manifest(directory)
    if manifest is None or name not in manifest["files"]:
        return None
    return Path(directory or settings.CLUSTERUI_AGENT_WHEELHOUSE) / name


def console_agent_version():
    """The agent release this console installs: its wheelhouse's, else the version of the
    agent/ folder it would build (read as text: the server never imports the agent)."""
    manifest = read_manifest()
    if manifest is not None:
        return manifest["agent_version"]
    found = re.search(r'^__version__ = "([^"]+)"', (AGENT_SOURCE / "__init__.py").read_text(),
                      re.MULTILINE)
    return found.group(1) if found else ""


def agent_is_behind(version, current):
    """Whether an agent that said `version` in its hello is older than `current` (a version
    that is not one, e.g. a hand-built agent's, counts as older; none said: not judged)."""
    if not version or not current:
        return False
    try:
        return Version(version) < Version(current)
    except InvalidVersion:
        return True
