"""Break-glass sign-in: local admin accounts sign in with a password on their own URL, also
while OpenID Connect is on; every attempt is audited; CLUSTERUI_BREAK_GLASS=false turns it
off (404)."""

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from clusters.models import AuditEntry
from clusters.oidc import sign_in_with_claims
from clusters.roles import Role
from clusters.tests.factories import UserFactory

from .oidc import claims, enable_oidc

pytestmark = pytest.mark.django_db

URL = "/accounts/break-glass/"


@pytest.fixture
def root(db):
    return UserFactory(username="root", role=Role.ADMIN)


def attempts():
    return list(AuditEntry.objects.filter(action="user.break_glass_sign_in").order_by("id"))


def test_it_lives_on_its_own_url():
    assert reverse("break_glass") == URL


def test_the_form_is_shown_to_anyone(client):
    response = client.get(URL)
    assert response.status_code == 200
    assert 'name="password"' in response.text


def test_a_local_admin_signs_in_and_it_is_audited(client, root, settings):
    enable_oidc(settings)  # works beside the provider, which /accounts/login/ goes to
    response = client.post(URL, {"username": "root", "password": "password",
                                 "next": "/clusters/"})
    assert response.status_code == 302 and response["Location"] == "/clusters/"
    assert client.session["_auth_user_id"] == str(root.pk)
    assert client.session["_auth_user_backend"] == "django.contrib.auth.backends.ModelBackend"
    [entry] = attempts()
    assert entry.actor == root
    assert entry.changes == {"outcome": "signed in", "username": "root"}
    assert entry.source_ip == "127.0.0.1"
    assert client.get("/clusters/").status_code == 200


@pytest.mark.parametrize("username, password, reason", [
    ("root", "wrong", "wrong password"),
    ("nobody", "password", "no such local account"),
])
def test_a_failed_attempt_is_refused_and_audited(client, root, username, password, reason):
    response = client.post(URL, {"username": username, "password": password})
    assert response.status_code == 200
    assert "Wrong user name or password" in response.text
    assert "_auth_user_id" not in client.session
    [entry] = attempts()
    assert entry.actor is None
    assert entry.changes == {"method": "password", "outcome": "refused", "reason": reason,
                             "username": username}
    assert entry.object_repr == username


def test_a_viewer_is_refused_even_with_the_right_password(client):
    UserFactory(username="vera", role=Role.VIEWER)
    client.post(URL, {"username": "vera", "password": "password"})
    assert "_auth_user_id" not in client.session
    assert attempts()[0].changes["reason"] == "not an admin"


def test_a_disabled_admin_is_refused(client, root):
    get_user_model().objects.filter(pk=root.pk).update(is_active=False)
    client.post(URL, {"username": "root", "password": "password"})
    assert "_auth_user_id" not in client.session
    assert attempts()[0].changes["reason"] == "account disabled"


def test_an_identity_provider_user_has_no_local_password(client, settings):
    enable_oidc(settings)
    sign_in_with_claims(claims(sub="sub-ada", groups=["platform-admins"]))
    client.post(URL, {"username": "ada", "password": ""})
    client.post(URL, {"username": "ada", "password": "anything"})
    assert "_auth_user_id" not in client.session
    assert [e.changes["reason"] for e in attempts()] == [
        "no local password (signs in through the identity provider)"]


def test_turned_off_it_is_not_found(client, root, settings):
    settings.CLUSTERUI_BREAK_GLASS = False
    assert client.get(URL).status_code == 404
    assert client.post(URL, {"username": "root", "password": "password"}).status_code == 404
    assert "_auth_user_id" not in client.session
    assert attempts() == []
