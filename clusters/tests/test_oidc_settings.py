"""The sign-in settings: the group -> role mapping's format, and start-up refusing a partial
or malformed OpenID Connect configuration, naming the variable."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from clusters.oidc import parse_role_groups

ROOT = Path(__file__).resolve().parents[2]
NAME = "CLUSTERUI_OIDC_ROLE_GROUPS"
OIDC = {
    "CLUSTERUI_OIDC_ISSUER": "https://idp.example.com/realms/ops",
    "CLUSTERUI_OIDC_AUTHORIZATION_ENDPOINT": "https://idp.example.com/auth",
    "CLUSTERUI_OIDC_TOKEN_ENDPOINT": "https://idp.example.com/token",
    "CLUSTERUI_OIDC_USERINFO_ENDPOINT": "https://idp.example.com/userinfo",
    "CLUSTERUI_OIDC_JWKS_URI": "https://idp.example.com/certs",
    "CLUSTERUI_OIDC_CLIENT_ID": "clusterui",
    "CLUSTERUI_OIDC_CLIENT_SECRET": "s3cret",
    "CLUSTERUI_OIDC_ROLE_GROUPS": "admin=platform-admins,viewer=ml-engineers",
}


def test_the_mapping_lists_each_roles_groups():
    assert parse_role_groups(
        NAME, "admin=platform-admins, operator=platform-oncall ,viewer=ml-engineers;researchers"
    ) == {"platform-admins": "admin", "platform-oncall": "operator",
          "ml-engineers": "viewer", "researchers": "viewer"}


def test_groups_may_be_paths_or_ids():
    assert parse_role_groups(NAME, "operator=/ops/oncall;6f1c2a9e-0d8b-4d3e-9a55-3b7f0c1d2e4f") == {
        "/ops/oncall": "operator", "6f1c2a9e-0d8b-4d3e-9a55-3b7f0c1d2e4f": "operator"}


@pytest.mark.parametrize("value, message", [
    ("", "maps no IdP group to a role"),
    ("admins", "'admins' is not role=group;group"),
    ("root=platform-admins", "unknown role 'root'"),
    ("viewer=a,viewer=b", "viewer is given twice"),
    ("viewer=a;;b", "an empty group name"),
    ("viewer=", "an empty group name"),
    ("admin=ops,viewer=ops", "group 'ops' is mapped to both admin and viewer"),
])
def test_a_malformed_mapping_names_the_variable_and_the_mistake(value, message):
    with pytest.raises(ImproperlyConfigured) as raised:
        parse_role_groups(NAME, value)
    assert str(raised.value).startswith(f"{NAME}")
    assert message in str(raised.value)


def load_settings(**env):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CLUSTERUI_OIDC_")}
    clean.update({k: v for k, v in env.items() if v is not None})
    return subprocess.run(
        [sys.executable, "-c",
         "import django; django.setup(); from django.conf import settings; "
         "from clusters.oidc import role_groups; "
         "print(settings.CLUSTERUI_OIDC_ENABLED, settings.AUTHENTICATION_BACKENDS[0], "
         "settings.OIDC_RP_CLIENT_SECRET, sorted(role_groups()))"],
        cwd=ROOT, env={**clean, "DJANGO_SETTINGS_MODULE": "clusterui.settings",
                       "CLUSTERUI_MODE": "embedded"},
        capture_output=True, text=True, timeout=60,
    )


def test_without_oidc_variables_local_accounts_sign_in():
    result = load_settings()
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "django.contrib.auth.backends.ModelBackend",
                                     "None", "[]"]


def test_a_complete_oidc_configuration_turns_it_on(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("from-a-file\n")
    result = load_settings(**{**OIDC, "CLUSTERUI_OIDC_CLIENT_SECRET": None,
                              "CLUSTERUI_OIDC_CLIENT_SECRET_FILE": str(secret)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "clusters.oidc.OIDCBackend", "from-a-file",
                                     "['ml-engineers',", "'platform-admins']"]


@pytest.mark.parametrize("missing", [
    "CLUSTERUI_OIDC_AUTHORIZATION_ENDPOINT", "CLUSTERUI_OIDC_TOKEN_ENDPOINT",
    "CLUSTERUI_OIDC_USERINFO_ENDPOINT", "CLUSTERUI_OIDC_JWKS_URI", "CLUSTERUI_OIDC_CLIENT_ID",
    "CLUSTERUI_OIDC_CLIENT_SECRET", "CLUSTERUI_OIDC_ROLE_GROUPS",
])
def test_a_missing_oidc_variable_stops_start_up_naming_it(missing):
    result = load_settings(**{**OIDC, missing: None})
    assert result.returncode != 0
    assert f"{missing} is required when CLUSTERUI_OIDC_ISSUER is set" in result.stderr


def test_oidc_variables_without_the_issuer_stop_start_up():
    result = load_settings(**{**OIDC, "CLUSTERUI_OIDC_ISSUER": None})
    assert result.returncode != 0
    assert "CLUSTERUI_OIDC_ISSUER is required when CLUSTERUI_OIDC_AUTHORIZATION_ENDPOINT" in (
        result.stderr)
    result = load_settings(CLUSTERUI_OIDC_END_SESSION_ENDPOINT="https://idp.example.com/end")
    assert "CLUSTERUI_OIDC_ISSUER is required when CLUSTERUI_OIDC_END_SESSION_ENDPOINT" in (
        result.stderr)


@pytest.mark.parametrize("variable, value, message", [
    ("CLUSTERUI_OIDC_ROLE_GROUPS", "boss=platform-admins",
     "CLUSTERUI_OIDC_ROLE_GROUPS: unknown role 'boss'"),
    ("CLUSTERUI_OIDC_TOKEN_ENDPOINT", "http://idp.example.com/token",
     "CLUSTERUI_OIDC_TOKEN_ENDPOINT must be an https:// URL"),
    ("CLUSTERUI_OIDC_SCOPES", "email groups", "CLUSTERUI_OIDC_SCOPES must include openid"),
    ("CLUSTERUI_OIDC_CLIENT_AUTH", "private_key_jwt",
     "CLUSTERUI_OIDC_CLIENT_AUTH must be client_secret_basic or client_secret_post"),
    ("CLUSTERUI_OIDC_TIMEOUT_S", "soon", "CLUSTERUI_OIDC_TIMEOUT_S must be a number"),
])
def test_a_malformed_oidc_variable_stops_start_up_naming_it(variable, value, message):
    result = load_settings(**{**OIDC, variable: value})
    assert result.returncode != 0
    assert message in result.stderr


def test_a_loopback_provider_may_use_plain_http():
    result = load_settings(**{**OIDC,
                              "CLUSTERUI_OIDC_TOKEN_ENDPOINT": "http://127.0.0.1:9000/token"})
    assert result.returncode == 0, result.stderr


def test_forms_may_end_at_the_provider_under_the_content_security_policy():
    """Sign-out is a form whose redirect ends at the end_session endpoint; Chromium holds
    form-action to that redirect too (tests/test_browser_oidc.py signs out in Chromium)."""
    env = {**OIDC, "CLUSTERUI_OIDC_END_SESSION_ENDPOINT": "https://logout.example.com/end"}
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CLUSTERUI_OIDC_")}
    result = subprocess.run(
        [sys.executable, "-c",
         "import django; django.setup(); from django.conf import settings; "
         "print(*settings.CONTENT_SECURITY_POLICY['DIRECTIVES']['form-action'])"],
        cwd=ROOT, env={**clean, **env, "DJANGO_SETTINGS_MODULE": "clusterui.settings",
                       "CLUSTERUI_MODE": "embedded"},
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["'self'", "https://idp.example.com",
                                     "https://logout.example.com"]
