"""The agent's wheel (agent/pyproject.toml): every module and data file, its version, its
command and its pinned dependencies."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import agent

AGENT = Path(agent.__file__).parent


def test_the_wheel_holds_the_whole_agent_and_its_command(tmp_path):
    source = tmp_path / "agent"
    shutil.copytree(AGENT, source, ignore=shutil.ignore_patterns("tests", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-index",
                    "--no-build-isolation", "--wheel-dir", str(tmp_path / "out"), str(source)],
                   check=True, capture_output=True)
    (wheel,) = (tmp_path / "out").glob("*.whl")
    assert wheel.name == f"clusterui_agent-{agent.__version__}-py3-none-any.whl"
    names = set(zipfile.ZipFile(wheel).namelist())

    expected = {f"agent/{path.relative_to(AGENT)}" for path in AGENT.rglob("*")
                if path.is_file() and "tests" not in path.relative_to(AGENT).parts
                and "__pycache__" not in path.parts and path.name != "pyproject.toml"
                and path.name != "requirements.txt" and path.name != "README.md"}
    assert expected - names == set()  # a new subpackage or data file must be listed there

    info = f"clusterui_agent-{agent.__version__}.dist-info"
    metadata = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
    entry_points = zipfile.ZipFile(wheel).read(f"{info}/entry_points.txt").decode()
    assert "clusterui-agent = agent.cli:main" in entry_points
    assert "Requires-Python: >=3.9" in metadata
    requirements = [line for line in (AGENT / "requirements.txt").read_text().splitlines()
                    if line and not line.startswith("#")]
    for line in requirements:
        assert f"Requires-Dist: {line}" in metadata
