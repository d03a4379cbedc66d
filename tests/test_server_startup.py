"""clusterui/asgi.py: a server process imports its URLconf when it starts. Django resolves a
request's URL on the event loop, so an import left to the first request would hold every
agent's frames and every page for as long as it takes (0.4 s of CPU)."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_asgi_application_imports_every_view_before_its_first_request(tmp_path):
    code = ("import sys; import clusterui.asgi; "
            "print(sorted(m for m in ('clusterui.urls', 'api.urls', 'nodes.views') "
            "if m in sys.modules))")
    env = {"CLUSTERUI_MODE": "embedded", "CLUSTERUI_DATA_DIR": str(tmp_path),
           "DJANGO_SETTINGS_MODULE": "clusterui.settings", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['api.urls', 'clusterui.urls', 'nodes.views']"
