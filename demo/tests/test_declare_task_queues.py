"""declare_task_queues: the embedded broker's queues exist before Celery beat and the
workers start. Without it, beat lost a race to create them in 1 of 5 demo starts (UNIQUE
constraint failed: kombu_queue.name) and sent no task for the rest of the run: no health
sweep, no repair proposed (issue 27)."""

import sqlite3
import subprocess
import sys
from pathlib import Path

from django.conf import settings

REPO = Path(__file__).resolve().parents[2]
PRODUCTION_ONLY = ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "SECRET_KEY",
                   "ALLOWED_HOSTS", "SECURE_COOKIES", "CLUSTERUI_SECRETS_KEYS")


def declare(data_dir):
    import os

    env = {key: value for key, value in os.environ.items() if key not in PRODUCTION_ONLY}
    env.update(CLUSTERUI_MODE="embedded", CLUSTERUI_DATA_DIR=str(data_dir))
    return subprocess.run([sys.executable, "manage.py", "declare_task_queues"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120, check=True)


def test_every_task_queue_is_in_the_embedded_broker_once_however_often_it_runs(tmp_path):
    declare(tmp_path)
    declare(tmp_path)

    broker = sqlite3.connect(tmp_path / "celery-broker.sqlite3")
    names = [name for (name,) in broker.execute("SELECT name FROM kombu_queue ORDER BY id")]
    assert names == list(settings.CELERY_TASK_QUEUES)


def test_the_demo_declares_them_before_it_starts_celery():
    script = (REPO / "scripts" / "demo.sh").read_text()
    declared = script.index('manage.py declare_task_queues')
    assert declared < script.index("start sweeps ") and declared < script.index("start beat ")
