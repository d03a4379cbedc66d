"""The agent runs on the Python of its users' nodes: 3.9 and later (RHEL 9 ships 3.9,
Ubuntu 22.04 3.10; issue 28). vermin reads its code for anything newer, and its
requirements name, for each Python, one websockets that supports it and the backports
agent/compat.py imports."""

import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

AGENT = Path(__file__).resolve().parents[1] / "agent"
OLDEST = "3.9"


def test_the_agents_code_needs_nothing_newer_than_python_3_9():
    done = subprocess.run(
        [str(Path(sys.executable).parent / "vermin"), f"-t={OLDEST}-", "--violations", "--no-tips",
         "--eval-annotations", "--exclude-regex", "/agent/tests/", str(AGENT)],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def requirements_for(python_version):
    names = {}
    for line in (AGENT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate(
                {"python_version": python_version, "python_full_version": python_version + ".0"}):
            names.setdefault(requirement.name, []).append(str(requirement.specifier))
    return names


def test_each_python_from_3_9_gets_one_websockets_and_the_backports_it_lacks():
    for version in ("3.9", "3.10", "3.11", "3.12", "3.13"):
        found = requirements_for(version)
        assert len(found["websockets"]) == 1, (version, found)
        old = version in ("3.9", "3.10")
        assert ("tomli" in found) == old and ("async-timeout" in found) == old, (version, found)
    assert requirements_for("3.9")["websockets"] == ["==15.0.1"]  # Requires-Python >=3.9
