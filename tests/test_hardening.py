"""Hardening: production cookies and HSTS, CSRF on every POST (htmx sends the token), and the
Content Security Policy on every page.

`manage.py check --deploy` with production settings is tested in test_settings.py
(test_production_settings_pass_the_deploy_check); the WebSocket origin check in
test_authorization_matrix.py."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client
from django.urls import get_resolver, reverse

from clusters.roles import Role
from clusters.tests.factories import UserFactory
from tests.test_authorization_matrix import (  # noqa: F401 (fixtures)
    ANONYMOUS,
    TABLE,
    quick_password_hashing,
    url_for,
    url_patterns,
    world,
)

ROOT = Path(__file__).resolve().parents[1]
PRODUCTION = {
    "CLUSTERUI_MODE": "production",
    "SECRET_KEY": "x7Qp2Lm9Vt4Rb8Kd1Zs6Hw3Ny5Fj0Ga" * 2,
    "ALLOWED_HOSTS": "console.example.com",
    "DATABASE_URL": "postgres://clusterui@127.0.0.1:5432/clusterui",
    "REDIS_URL": "redis://127.0.0.1:6379/0",
}
SECURITY_SETTINGS = [
    "SESSION_COOKIE_SECURE", "SESSION_COOKIE_HTTPONLY", "SESSION_COOKIE_SAMESITE",
    "CSRF_COOKIE_SECURE", "SECURE_HSTS_SECONDS", "SECURE_HSTS_INCLUDE_SUBDOMAINS",
    "SECURE_HSTS_PRELOAD", "SECURE_SSL_REDIRECT", "SECURE_CONTENT_TYPE_NOSNIFF",
    "X_FRAME_OPTIONS",
]


def production_settings():
    """The security settings a production start-up gets from its environment alone (no
    SECURE_* overrides: make test turns the SSL redirect off for its own server)."""
    env = {k: v for k, v in os.environ.items()
           if k not in PRODUCTION and not k.startswith("SECURE_") and not k.endswith("_FILE")}
    code = ("import django, json; django.setup(); from django.conf import settings; "
            f"print(json.dumps({{name: getattr(settings, name) for name in {SECURITY_SETTINGS}}}))")
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**env, **PRODUCTION, "DJANGO_SETTINGS_MODULE": "clusterui.settings"})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def production():
    return production_settings()


def test_production_cookies_are_secure_and_the_session_cookie_http_only(production):
    assert production["SESSION_COOKIE_SECURE"] is True
    assert production["SESSION_COOKIE_HTTPONLY"] is True
    assert production["SESSION_COOKIE_SAMESITE"] == "Lax"
    assert production["CSRF_COOKIE_SECURE"] is True


def test_production_asks_for_https_for_a_year(production):
    assert production["SECURE_SSL_REDIRECT"] is True
    assert production["SECURE_HSTS_SECONDS"] >= 365 * 24 * 3600
    assert production["SECURE_HSTS_INCLUDE_SUBDOMAINS"] is True
    assert production["SECURE_CONTENT_TYPE_NOSNIFF"] is True
    assert production["X_FRAME_OPTIONS"] == "DENY"


@pytest.fixture
def as_in_production(settings, production):
    for name, value in production.items():
        setattr(settings, name, value)
    return settings


@pytest.mark.django_db
def test_a_response_in_production_carries_hsts_and_secure_cookies(as_in_production):
    UserFactory(username="ada", password="correct horse battery", role=Role.ADMIN)
    client = Client()
    page = client.get(reverse("login"), secure=True)
    assert page["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains; preload"
    assert page.cookies["csrftoken"]["secure"] is True

    signed_in = client.post(reverse("login"), {"username": "ada",
                                               "password": "correct horse battery"}, secure=True)
    assert signed_in.status_code == 302
    session = signed_in.cookies[as_in_production.SESSION_COOKIE_NAME]
    assert session["secure"] is True and session["httponly"] is True
    assert session["samesite"] == "Lax"


@pytest.mark.django_db
def test_plain_http_is_sent_to_https_in_production(as_in_production, client):
    response = client.get(reverse("login"))
    assert response.status_code == 301
    assert response["Location"].startswith("https://")


def test_the_health_probe_answers_plain_http_in_production(db, as_in_production, client):
    response = client.get(reverse("healthz"))
    assert response.status_code == 200
    assert "Strict-Transport-Security" not in response  # browsers ignore it over HTTP anyway


# CSRF.


def hx_headers_of(page):
    """The headers htmx sends with every request from the page: base.html's hx-headers."""
    match = re.search(r"<body[^>]*\shx-headers='([^']*)'", page.text)
    assert match, "base.html's <body> has no hx-headers"
    return json.loads(match.group(1))


def signed_in_admin_csrf_client():
    client = Client(enforce_csrf_checks=True)
    client.force_login(UserFactory(username="ada", password=None, role=Role.ADMIN))
    return client


def test_every_page_carries_the_csrf_token_for_htmx(db, cluster):
    client = signed_in_admin_csrf_client()
    page = client.get(reverse("clusterui:overview", args=[cluster.slug]))
    token = hx_headers_of(page)["X-CSRFToken"]
    assert token and client.cookies["csrftoken"].value
    # The page's token is what the CSRF check accepts: an htmx POST with it gets through.
    response = client.post(reverse("nodes:list", args=[cluster.slug]),
                           headers={"X-CSRFToken": token, "HX-Request": "true"})
    assert response.status_code == 405  # past the CSRF check, to the view's own answer


# POSTs that take no cookie: a forged cross-site request carries nothing they accept.
CSRF_EXEMPT = {"agent_bundle_upload": "an agent's upload, with its node token (Bearer)"}
POST_CASES = [pytest.param(name, route, id=name)
              for name, route in url_patterns(get_resolver())
              if name in TABLE and name not in CSRF_EXEMPT]


@pytest.mark.django_db
def test_a_csrf_exempt_post_ignores_the_signed_in_session(world):
    client = signed_in_admin_csrf_client()
    for name, route in url_patterns(get_resolver()):
        if name in CSRF_EXEMPT:
            response = client.post(url_for(name, route, world), b"x",
                                   content_type="application/gzip")
            assert response.status_code == 401, (name, response.status_code)


@pytest.mark.django_db
@pytest.mark.parametrize("name, route", POST_CASES)
def test_every_post_without_the_csrf_token_is_refused(world, name, route):
    url = url_for(name, route, world)
    client = signed_in_admin_csrf_client()
    refused = client.post(url, TABLE[name].data)
    assert refused.status_code == 403 and b"CSRF verification failed" in refused.content, (
        f"POST {url} without a CSRF token: {refused.status_code}")

    home = client.get(reverse("clusterui:cluster_list"))
    with_token = client.post(url, TABLE[name].data, headers=hx_headers_of(home))
    assert with_token.status_code == TABLE[name].post[Role.ADMIN]


# Content Security Policy.


def csp_directives(response):
    header = response.get("Content-Security-Policy")
    assert header, f"{response.request['PATH_INFO']}: no Content-Security-Policy header"
    return {name: values for name, *values in
            (directive.split() for directive in header.split(";") if directive.strip())}


def html_pages():
    """Every GET that answers an HTML page: as admin, and as anonymous for sign-in's pages."""
    for name, route in url_patterns(get_resolver()):
        if name not in TABLE:
            continue
        for persona in (ANONYMOUS, Role.ADMIN):
            if TABLE[name].get[persona] == 200:
                label = persona if persona == ANONYMOUS else persona.label
                yield pytest.param(name, route, persona, id=f"{name} {label}")


@pytest.mark.django_db
@pytest.mark.parametrize("name, route, persona", list(html_pages()))
def test_every_page_has_the_csp_and_every_script_its_nonce_or_our_origin(world, name, route,
                                                                         persona):
    client = Client()
    if persona != ANONYMOUS:
        client.force_login(UserFactory(username="ada", password=None, role=persona))
    response = client.get(url_for(name, route, world))
    assert response.status_code == 200

    directives = csp_directives(response)
    script_src = directives["script-src"]
    assert script_src[0] == "'self'", script_src
    # django-csp adds the nonce when the page uses it: pages with scripts do.
    assert all(v.startswith("'nonce-") for v in script_src[1:]) and len(script_src) <= 2
    assert "'unsafe-eval'" not in response["Content-Security-Policy"]
    assert directives["object-src"] == ["'none'"] and directives["frame-ancestors"] == ["'none'"]

    html = response.content.decode()
    # What the policy blocks without saying so on the page: inline handlers, javascript:
    # URLs, and htmx's hx-on (it evaluates code; allowEval is off).
    assert not re.search(r"<[^>]*\s(on[a-z]+|hx-on[^=]*)=", html), "an inline event handler"
    assert "javascript:" not in html
    nonce = script_src[1][len("'nonce-"):-1] if len(script_src) == 2 else None
    for tag in re.findall(r"<script\b[^>]*>", html):
        src = re.search(r'\ssrc="([^"]*)"', tag)
        if src:
            assert src.group(1).startswith("/") and not src.group(1).startswith("//"), tag
        elif 'type="application/json"' in tag:
            continue  # data for a script (json_script): never run, so not under script-src
        else:
            assert nonce and f'nonce="{nonce}"' in tag, (
                f"an inline script without the page's nonce: {tag}")
