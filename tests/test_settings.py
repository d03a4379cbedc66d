"""Start-up refuses a production configuration that is missing or malformed, naming the variable."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GOOD = {
    "CLUSTERUI_MODE": "production",
    "SECRET_KEY": "k" * 64,
    "ALLOWED_HOSTS": "console.example.com",
    "DATABASE_URL": "postgres://clusterui@127.0.0.1:5432/clusterui",
    "REDIS_URL": "redis://127.0.0.1:6379/0",
}


def load_settings(**env):
    clean = {k: v for k, v in os.environ.items()
             if k not in GOOD and not k.endswith("_FILE")}
    clean.update({k: v for k, v in env.items() if v is not None})
    return subprocess.run(
        [sys.executable, "-c",
         "import django; django.setup(); from django.conf import settings; "
         "print(settings.DATABASES['default']['ENGINE'], settings.CHANNEL_LAYERS['default']"
         "['BACKEND'])"],
        cwd=ROOT, env={**clean, "DJANGO_SETTINGS_MODULE": "clusterui.settings"},
        capture_output=True, text=True, timeout=60,
    )


def test_a_complete_production_configuration_loads():
    result = load_settings(**GOOD)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["django.db.backends.postgresql",
                                     "clusterui.channel_layer.RedisChannelLayer"]


@pytest.mark.parametrize("missing", ["SECRET_KEY", "ALLOWED_HOSTS", "DATABASE_URL", "REDIS_URL"])
def test_a_missing_variable_stops_start_up_naming_it(missing):
    result = load_settings(**{**GOOD, missing: None})
    assert result.returncode != 0
    assert f"{missing} is required when CLUSTERUI_MODE=production" in result.stderr


@pytest.mark.parametrize("variable, value, message", [
    ("DATABASE_URL", "sqlite:///db.sqlite3", "DATABASE_URL must be a postgres:// URL"),
    ("DATABASE_URL", "nonsense://", "DATABASE_URL is malformed"),
    ("REDIS_URL", "localhost:6379", "REDIS_URL must be a redis:// URL"),
    ("SECRET_KEY", "short", "SECRET_KEY must be at least 50 characters"),
    ("CLUSTERUI_MODE", "staging", "CLUSTERUI_MODE must be embedded or production"),
    ("CLUSTERUI_BOOT_WINDOW_S", "two minutes", "CLUSTERUI_BOOT_WINDOW_S must be an integer"),
    ("DEBUG", "maybe", "DEBUG must be true or false"),
])
def test_a_malformed_variable_stops_start_up_naming_it(variable, value, message):
    result = load_settings(**{**GOOD, variable: value})
    assert result.returncode != 0
    assert message in result.stderr


def test_secrets_can_come_from_files(tmp_path):
    key_file = tmp_path / "secret_key"
    key_file.write_text("f" * 64 + "\n")
    result = load_settings(**{**GOOD, "SECRET_KEY": None, "SECRET_KEY_FILE": str(key_file)})
    assert result.returncode == 0, result.stderr


def test_embedded_mode_needs_nothing(tmp_path):
    result = load_settings(CLUSTERUI_MODE=None, CLUSTERUI_DATA_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["django.db.backends.sqlite3",
                                     "channels.layers.InMemoryChannelLayer"]


def test_production_settings_pass_the_deploy_check():
    env = {k: v for k, v in os.environ.items() if k not in GOOD and not k.startswith("SECURE_")}
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT, env={**env, **GOOD, "SECRET_KEY": "x7Qp2Lm9Vt4Rb8Kd1Zs6Hw3Ny5Fj0Ga" * 2},
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
