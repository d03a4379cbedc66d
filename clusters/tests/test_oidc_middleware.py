"""SignInRedirectMiddleware: an htmx request that must go by the sign-in (anonymous, or an
OpenID Connect session due for renewal) gets HX-Redirect to the sign-in page, back to the
page the browser is on; a plain request gets the usual redirect."""

import time
from urllib.parse import parse_qs, urlsplit

import pytest
from django.urls import reverse

from clusters.roles import Role
from clusters.tests.factories import UserFactory

from .oidc import ISSUER, enable_oidc

pytestmark = pytest.mark.django_db

PAGE = "/clusters/"
HTMX = {"HTTP_HX_REQUEST": "true",
        "HTTP_HX_CURRENT_URL": "http://testserver/c/prod/nodes/?state=paused"}


@pytest.fixture
def oidc(settings):
    enable_oidc(settings)


@pytest.fixture
def oidc_session(client, oidc):
    """A client signed in through the OIDC backend, its ID token due for renewal."""
    user = UserFactory(username="olivia", role=Role.OPERATOR)
    client.force_login(user, backend="clusters.oidc.OIDCBackend")
    return client


def renew_in(client, seconds):
    session = client.session
    session["oidc_id_token_expiration"] = time.time() + seconds
    session.save()


def test_an_anonymous_htmx_request_gets_hx_redirect_back_to_the_current_page(client):
    response = client.get(PAGE, **HTMX)
    assert response.status_code == 401
    assert response["HX-Redirect"] == (
        reverse("login") + "?next=%2Fc%2Fprod%2Fnodes%2F%3Fstate%3Dpaused")
    assert "Location" not in response


def test_an_anonymous_plain_request_gets_the_usual_redirect(client):
    response = client.get(PAGE)
    assert response.status_code == 302
    assert response["Location"] == reverse("login") + "?next=/clusters/"
    assert "HX-Redirect" not in response


def test_a_current_url_on_another_site_is_not_followed(client):
    response = client.get(PAGE, HTTP_HX_REQUEST="true",
                          HTTP_HX_CURRENT_URL="https://evil.example.com/phish")
    assert response["HX-Redirect"] == reverse("login")


def test_an_expired_oidc_session_sends_a_plain_request_to_the_provider(oidc_session):
    response = oidc_session.get(PAGE)
    assert response.status_code == 302
    location = urlsplit(response["Location"])
    assert f"{location.scheme}://{location.netloc}{location.path}" == f"{ISSUER}/authorize"
    query = parse_qs(location.query)
    assert query["prompt"] == ["none"]
    assert query["code_challenge_method"] == ["S256"]


def test_an_expired_oidc_session_answers_htmx_with_hx_redirect(oidc_session):
    response = oidc_session.get(PAGE, **HTMX)
    assert response.status_code == 401
    assert response["HX-Redirect"] == (
        reverse("login") + "?next=%2Fc%2Fprod%2Fnodes%2F%3Fstate%3Dpaused")
    # The sign-in page, still signed in, goes straight on to that page, where a plain
    # request renews the session by the provider.
    follow = oidc_session.get(response["HX-Redirect"])
    assert follow["Location"] == "/c/prod/nodes/?state=paused"


def test_a_fresh_oidc_session_is_served(oidc_session):
    renew_in(oidc_session, 600)
    assert oidc_session.get(PAGE).status_code == 200
    assert oidc_session.get(PAGE, **HTMX).status_code == 200


def test_a_break_glass_session_is_not_sent_to_the_provider(client, oidc):
    admin = UserFactory(username="root", role=Role.ADMIN)
    client.force_login(admin, backend="django.contrib.auth.backends.ModelBackend")
    assert client.get(PAGE).status_code == 200


def test_without_oidc_nothing_is_renewed(client, settings):
    user = UserFactory(username="vera", role=Role.VIEWER)
    client.force_login(user)
    assert not settings.CLUSTERUI_OIDC_ENABLED
    assert client.get(PAGE, **HTMX).status_code == 200


def test_other_redirects_of_htmx_requests_are_left_alone(client):
    UserFactory(username="vera", role=Role.VIEWER)
    client.login(username="vera", password="password")
    response = client.get(reverse("login"), **HTMX)  # signed in: on to LOGIN_REDIRECT_URL
    assert response.status_code == 302
    assert response["Location"] == reverse("home")
