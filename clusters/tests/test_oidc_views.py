"""Signing in through the provider and out again: /accounts/login/, the redirect to the
provider, the callback (sign-in, audit, refusal page, the provider's errors) and sign-out.

Only the two HTTP calls the backend makes to the provider (token, userinfo) are replaced;
the ID token is a real RS256 token checked with the test key (tests/test_browser_oidc.py
goes through a real provider)."""

from unittest import mock
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from clusters.models import AuditEntry
from clusters.oidc import OIDCBackend
from clusters.roles import Role, role_of
from clusters.tests.factories import UserFactory

from .oidc import CLIENT_ID, ISSUER, claims, enable_oidc, id_token

pytestmark = pytest.mark.django_db

User = get_user_model()


@pytest.fixture
def oidc(settings):
    enable_oidc(settings)


def start_sign_in(client, next_url="/clusters/"):
    """GET the provider redirect like a browser; returns the authorization request's query."""
    response = client.get(reverse("oidc_authentication_init"), {"next": next_url})
    assert response.status_code == 302
    return {k: v[0] for k, v in parse_qs(urlsplit(response["Location"]).query).items()}


def come_back(client, authorization, userinfo_claims, id_claims=None):
    """The provider's redirect to the callback, with the token and userinfo answers it
    would give for these claims."""
    id_claims = id_claims or userinfo_claims
    token = id_token(**{**id_claims, "nonce": authorization["nonce"]})
    userinfo = {k: v for k, v in userinfo_claims.items() if k not in ("iss", "aud")}
    with mock.patch.object(OIDCBackend, "get_token",
                           return_value={"id_token": token, "access_token": "at"}) as get_token, \
            mock.patch.object(OIDCBackend, "get_userinfo", return_value=userinfo):
        response = client.get(reverse("oidc_authentication_callback"),
                              {"code": "the-code", "state": authorization["state"]})
    return response, get_token


def test_sign_in_sends_people_to_the_provider_with_pkce_when_oidc_is_on(client, oidc):
    response = client.get(reverse("login"), {"next": "/clusters/"})
    assert response.status_code == 302
    assert response["Location"] == reverse("oidc_authentication_init") + "?next=%2Fclusters%2F"
    authorization = start_sign_in(client)
    assert authorization["client_id"] == CLIENT_ID
    assert authorization["response_type"] == "code"
    assert authorization["scope"] == "openid email profile groups"
    assert authorization["code_challenge_method"] == "S256"
    assert len(authorization["code_challenge"]) == 43
    assert authorization["redirect_uri"] == "http://testserver/oidc/callback/"
    assert authorization["state"] and authorization["nonce"]


def test_sign_in_is_the_local_form_when_oidc_is_off(client):
    response = client.get(reverse("login"))
    assert response.status_code == 200
    assert 'name="password"' in response.text
    assert client.get(reverse("oidc_authentication_init")).status_code == 404
    assert client.get(reverse("oidc_authentication_callback")).status_code == 404


def test_a_local_sign_in_is_audited(client):
    user = UserFactory(username="vera", role=Role.VIEWER)
    response = client.post(reverse("login"), {"username": "vera", "password": "password"})
    assert response.status_code == 302
    entry = AuditEntry.objects.get(action="user.sign_in")
    assert entry.actor == user and entry.changes == {"method": "password"}


def test_the_callback_signs_an_operator_in_and_audits_it(client, oidc):
    authorization = start_sign_in(client, "/clusters/")
    response, get_token = come_back(client, authorization, claims(groups=["platform-oncall"]))
    assert response.status_code == 302 and response["Location"] == "/clusters/"
    # PKCE: the token request carries the verifier of the challenge sent to the provider.
    assert get_token.call_args.args[0]["code_verifier"]
    user = User.objects.get(username="olivia")
    assert client.session["_auth_user_id"] == str(user.pk)
    assert role_of(user) == Role.OPERATOR
    entry = AuditEntry.objects.get(action="user.sign_in")
    assert entry.actor == user
    assert entry.changes["issuer"] == ISSUER
    assert entry.changes["groups"] == ["platform-oncall"]
    assert entry.changes["role"] == {"before": None, "after": "operator"}
    assert client.get("/clusters/").status_code == 200


def test_a_renewal_with_the_same_role_is_not_audited_again_but_a_changed_role_is(client, oidc):
    come_back(client, start_sign_in(client), claims(groups=["platform-oncall"]))
    come_back(client, start_sign_in(client), claims(groups=["platform-oncall"]))
    assert AuditEntry.objects.filter(action="user.sign_in").count() == 1
    come_back(client, start_sign_in(client), claims(groups=["ml-engineers"]))
    entries = AuditEntry.objects.filter(action="user.sign_in").order_by("id")
    assert entries.count() == 2
    assert entries.last().changes["role"] == {"before": "operator", "after": "viewer"}
    assert entries.last().changes["renewal"] is True


def test_someone_in_no_mapped_group_gets_a_page_that_says_why(client, oidc):
    response, _ = come_back(client, start_sign_in(client),
                            claims(sub="sub-nora", groups=["finance", "everyone"]))
    assert response.status_code == 302
    assert response["Location"] == reverse("sign_in_failed")
    page = client.get(reverse("sign_in_failed"))
    assert page.status_code == 403
    assert "none of your groups gives a role in clusterui" in page.text
    assert "<code>finance</code>, <code>everyone</code>" in page.text
    assert "<code>platform-oncall</code>" in page.text
    assert "<code>ml-engineers</code>, <code>researchers</code>" in page.text
    assert "_auth_user_id" not in client.session
    # The sign-in page is not a loop back to the provider: it stays put when reloaded.
    assert client.get(reverse("sign_in_failed")).status_code == 403


def test_a_signed_in_user_refused_at_renewal_is_signed_out(client, oidc):
    come_back(client, start_sign_in(client), claims(groups=["platform-oncall"]))
    response, _ = come_back(client, start_sign_in(client), claims(groups=[]))
    assert response["Location"] == reverse("sign_in_failed")
    assert "_auth_user_id" not in client.session
    assert role_of(User.objects.get(username="olivia")) is None


def test_an_error_from_the_provider_is_shown(client, oidc):
    authorization = start_sign_in(client)
    response = client.get(reverse("oidc_authentication_callback"), {
        "error": "access_denied", "error_description": "The user cancelled",
        "state": authorization["state"]})
    assert response["Location"] == reverse("sign_in_failed")
    page = client.get(reverse("sign_in_failed"))
    assert "The user cancelled" in page.text and "access_denied" in page.text


def test_a_silent_renewal_that_needs_a_login_goes_to_the_providers_sign_in(client, oidc):
    authorization = start_sign_in(client, "/c/prod/nodes/")
    response = client.get(reverse("oidc_authentication_callback"), {
        "error": "login_required", "state": authorization["state"]})
    assert response["Location"] == (reverse("oidc_authentication_init")
                                    + "?next=%2Fc%2Fprod%2Fnodes%2F")


def test_an_id_token_from_another_issuer_gets_the_failure_page_not_a_500(client, oidc):
    authorization = start_sign_in(client)
    response, _ = come_back(client, authorization, claims(),
                            id_claims=claims(iss="https://evil.example.com"))
    assert response["Location"] == reverse("sign_in_failed")
    page = client.get(reverse("sign_in_failed"))
    assert "failed a check" in page.text and "evil.example.com" in page.text
    assert not User.objects.exists()


def test_sign_out_ends_the_session_here_and_at_the_provider(client, oidc):
    come_back(client, start_sign_in(client), claims())
    token = client.session["oidc_id_token"]
    response = client.post(reverse("logout"))
    assert response.status_code == 302
    location = urlsplit(response["Location"])
    assert f"{location.scheme}://{location.netloc}{location.path}" == f"{ISSUER}/logout"
    query = {k: v[0] for k, v in parse_qs(location.query).items()}
    assert query == {"id_token_hint": token, "client_id": CLIENT_ID,
                     "post_logout_redirect_uri": "http://testserver/accounts/signed-out/"}
    assert "_auth_user_id" not in client.session
    entry = AuditEntry.objects.get(action="user.sign_out")
    assert entry.actor.username == "olivia"
    assert entry.changes == {"issuer": ISSUER, "at_provider": True}
    page = client.get(reverse("signed_out"))
    assert page.status_code == 200 and "session at the" in page.text


def test_sign_out_without_oidc_goes_to_the_sign_in_form(client_for, viewer):
    client = client_for(viewer)
    assert client.get(reverse("logout")).status_code == 405
    response = client.post(reverse("logout"))
    assert response["Location"] == reverse("login")
    assert "_auth_user_id" not in client.session
    assert AuditEntry.objects.get(action="user.sign_out").changes == {
        "issuer": None, "at_provider": False}
