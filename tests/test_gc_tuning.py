"""common/gc_tuning.py: a server process freezes its start-up heap and raises the
collector's thresholds, unless CLUSTERUI_GC_TUNING is false."""

import gc
import subprocess
import sys
from pathlib import Path

import pytest

from common import gc_tuning


@pytest.fixture
def restore_gc():
    """The collector as it was: these tests change process-wide state."""
    threshold, frozen = gc.get_threshold(), gc.get_freeze_count()
    yield
    gc.set_threshold(*threshold)
    if frozen == 0:
        gc.unfreeze()


def test_it_freezes_the_heap_and_raises_the_thresholds(settings, restore_gc):
    settings.CLUSTERUI_GC_TUNING = True
    gc.set_threshold(700, 10, 10)
    loaded = object.__new__(type("Loaded", (), {}))  # a tracked object alive at start-up

    assert gc_tuning.apply() is True

    assert gc.get_threshold() == gc_tuning.THRESHOLDS
    assert gc.get_freeze_count() > 0
    assert not any(o is loaded for o in gc.get_objects())  # out of every generation


def test_the_setting_turns_it_off(settings, restore_gc):
    settings.CLUSTERUI_GC_TUNING = False
    gc.set_threshold(700, 10, 10)
    frozen = gc.get_freeze_count()

    assert gc_tuning.apply() is False

    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == frozen


def test_the_setting_is_read_from_the_environment():
    root = Path(__file__).resolve().parents[1]
    code = ("import django; django.setup(); from django.conf import settings; "
            "print(settings.CLUSTERUI_GC_TUNING)")
    env = {"CLUSTERUI_MODE": "embedded", "DJANGO_SETTINGS_MODULE": "clusterui.settings",
           "PATH": "/usr/bin:/bin"}
    outputs = [subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True,
                              text=True, timeout=60, env={**env, **extra}).stdout.strip()
               for extra in ({}, {"CLUSTERUI_GC_TUNING": "false"})]
    assert outputs == ["True", "False"]


def test_the_agent_gateway_process_tunes_its_collector_before_serving(settings, restore_gc,
                                                                      monkeypatch):
    """The gateway is a server process of its own (manage.py agent_gateway): without the
    tuning its event loop stopped for 600-800 ms at each full collection."""
    from django.core.management import call_command

    from gateway.management.commands import agent_gateway

    settings.CLUSTERUI_GC_TUNING = True
    gc.set_threshold(700, 10, 10)
    thresholds_when_serving = []

    async def serve(host, port):
        thresholds_when_serving.append(gc.get_threshold())

    monkeypatch.setattr(agent_gateway, "run_gateway", serve)
    call_command("agent_gateway", "--port", "0")

    assert thresholds_when_serving == [gc_tuning.THRESHOLDS]
