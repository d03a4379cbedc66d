"""What `make demo` serves: static files with hashed names, compressed (Brotli and gzip) and
cached for a year (issue 27: the demo's first load fetched plotly.min.js's 4.8 MB
uncompressed with a 60 s cache; scripts/test.sh and scripts/demo.sh run collectstatic
first), and the processes scripts/demo.sh starts."""

import pytest
from django.templatetags.static import static
from django.test import Client

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("encoding", ["br", "gzip"])
def test_plotly_is_served_compressed_and_cached_for_a_year(encoding):
    url = static("vendor/plotly.min.js")
    assert url != "/static/vendor/plotly.min.js"  # a hashed name
    response = Client().get(url, HTTP_ACCEPT_ENCODING=f"{encoding}, identity")
    assert response.status_code == 200
    assert response["Content-Encoding"] == encoding
    assert int(response["Content-Length"]) < 2 * 1024 * 1024
    assert "max-age=315360000" in response["Cache-Control"]
    assert "immutable" in response["Cache-Control"]
    response.close()


def test_the_overview_links_the_hashed_names(client_for, viewer, cluster):
    text = client_for(viewer).get(f"/c/{cluster.slug}/").content.decode()
    assert static("vendor/plotly.min.js") in text


def test_every_module_scripts_demo_sh_runs_exists():
    """`make demo` ran `python -m agent.fleet` after the layout (issue 23) moved the fleet to
    agent/sim/fleet.py: the demo's simulated fleet exited at once (issue 27)."""
    import importlib.util
    import re
    from pathlib import Path

    script = (Path(__file__).resolve().parents[1] / "scripts" / "demo.sh").read_text()
    modules = set(re.findall(r'"\$PY" -m ([A-Za-z_][\w.]*)', script))
    assert {"agent.sim.fleet", "daphne", "celery"} <= modules
    assert [m for m in sorted(modules) if importlib.util.find_spec(m) is None] == []
