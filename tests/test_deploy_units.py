"""deploy/systemd: the server's unit files pass `systemd-analyze verify` (issue 28), each
instance of a template unit too. verify also checks that ExecStart's program exists, so the
units are checked installed under a temporary prefix, with this interpreter as the venv's
python; every other line is verified as shipped."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parents[1] / "deploy" / "systemd"
PREFIX = "/opt/clusterui"
INSTANCES = {"clusterui-web@.service": "8000", "clusterui-gateway@.service": "8001",
             "clusterui-uploads@.service": "8002", "clusterui-worker@.service": "sweeps"}

pytestmark = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                reason="no systemd-analyze on this machine")


def installed(tmp_path):
    """The units with /opt/clusterui under tmp_path, where venv/bin/python is this Python."""
    prefix = tmp_path / "opt" / "clusterui"
    (prefix / "venv" / "bin").mkdir(parents=True)
    (prefix / "venv" / "bin" / "python").symlink_to(sys.executable)
    units = tmp_path / "units"
    units.mkdir()
    for unit in UNITS.glob("clusterui*"):
        if unit.suffix in (".service", ".target"):
            (units / unit.name).write_text(unit.read_text().replace(PREFIX, str(prefix)))
    return units


def test_every_unit_and_instance_passes_systemd_analyze_verify(tmp_path):
    units = installed(tmp_path)
    names = sorted(path.name for path in units.iterdir())
    assert {"clusterui.target", "clusterui-migrate.service", "clusterui-beat.service",
            "clusterui-publisher.service", *INSTANCES} <= set(names)
    for template, instance in INSTANCES.items():
        (units / template.replace("@.", f"@{instance}.")).symlink_to(units / template)
    paths = [str(path) for path in sorted(units.iterdir()) if "@." not in path.name]

    done = subprocess.run(["systemd-analyze", "verify", *paths], cwd=units,
                          capture_output=True, text=True, timeout=120)

    assert done.returncode == 0 and done.stderr.strip() == "", done.stderr


def test_each_queue_in_the_settings_has_a_worker_the_readme_names():
    from django.conf import settings

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for queue in settings.CELERY_TASK_QUEUES:
        assert f"clusterui-worker@{queue}" in readme, queue
