"""The OpenID Connect backend: users keyed on iss + sub, name and email from the claims at
every sign-in, roles from the groups claim, and refusal of someone in no mapped group."""

from unittest import mock

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from django.contrib.auth import get_user_model
from django.core.exceptions import SuspiciousOperation
from django.test import RequestFactory

from clusters.models import AuditEntry, Identity
from clusters.oidc import OIDCBackend, sign_in_with_claims
from clusters.roles import Role, role_of
from clusters.tests.factories import UserFactory

from .oidc import CLIENT_ID, ISSUER, claims, enable_oidc, id_token

pytestmark = pytest.mark.django_db

User = get_user_model()


@pytest.fixture(autouse=True)
def oidc(settings):
    enable_oidc(settings)


def test_the_first_sign_in_creates_a_user_keyed_on_iss_and_sub():
    sign_in = sign_in_with_claims(claims(sub="sub-olivia", given_name="Olivia",
                                         family_name="Operator"))
    user = sign_in.user
    assert sign_in.created and not sign_in.refused
    assert user.username == "olivia"
    assert (user.first_name, user.last_name, user.email) == (
        "Olivia", "Operator", "sub-olivia@example.com")
    assert not user.has_usable_password()
    assert Identity.objects.get(user=user).issuer == ISSUER
    assert Identity.objects.get(user=user).sub == "sub-olivia"


def test_a_changed_email_and_name_update_the_same_user():
    first = sign_in_with_claims(claims(sub="sub-olivia", name="Olivia O")).user
    again = sign_in_with_claims(claims(sub="sub-olivia", email="olivia.new@example.com",
                                       name="Olivia Newname", preferred_username="o.new"))
    assert again.user.pk == first.pk and not again.created
    assert User.objects.count() == 1
    user = User.objects.get(pk=first.pk)
    assert (user.email, user.first_name) == ("olivia.new@example.com", "Olivia Newname")
    assert user.username == "olivia"  # chosen once: the audit trail keeps one name


def test_another_sub_with_the_same_email_is_another_user():
    first = sign_in_with_claims(claims(sub="sub-a", email="shared@example.com")).user
    second = sign_in_with_claims(claims(sub="sub-b", email="shared@example.com")).user
    assert first.pk != second.pk


def test_the_same_sub_at_another_issuer_is_another_user():
    first = sign_in_with_claims(claims(sub="sub-a")).user
    second = sign_in_with_claims(claims(sub="sub-a", iss="https://other-idp.example.com")).user
    assert first.pk != second.pk
    assert second.username == "a-2"


def test_a_local_account_with_the_same_name_is_not_taken_over():
    local = UserFactory(username="olivia", role=Role.ADMIN)
    user = sign_in_with_claims(claims(sub="sub-olivia")).user
    assert user.pk != local.pk
    assert user.username == "olivia-2"
    assert role_of(User.objects.get(pk=local.pk)) == Role.ADMIN


@pytest.mark.parametrize("groups, role", [
    (["ml-engineers"], Role.VIEWER),
    (["researchers", "unrelated"], Role.VIEWER),
    (["platform-oncall"], Role.OPERATOR),
    (["ml-engineers", "platform-oncall"], Role.OPERATOR),
    (["platform-admins", "ml-engineers", "platform-oncall"], Role.ADMIN),
])
def test_the_highest_mapped_role_wins(groups, role):
    user = sign_in_with_claims(claims(groups=groups)).user
    assert role_of(User.objects.get(pk=user.pk)) == role


def test_every_sign_in_re_syncs_the_role_so_a_removed_operator_becomes_a_viewer():
    user = sign_in_with_claims(claims(groups=["platform-oncall", "ml-engineers"])).user
    assert role_of(User.objects.get(pk=user.pk)) == Role.OPERATOR
    sign_in = sign_in_with_claims(claims(groups=["ml-engineers"]))
    assert (sign_in.role_before, sign_in.role) == (Role.OPERATOR, Role.VIEWER)
    assert role_of(User.objects.get(pk=user.pk)) == Role.VIEWER
    assert list(User.objects.get(pk=user.pk).groups.values_list("name", flat=True)) == ["viewer"]


def test_someone_in_no_mapped_group_is_refused_and_no_user_is_made():
    sign_in = sign_in_with_claims(claims(sub="sub-nora", groups=["finance", "everyone"]))
    assert sign_in.user is None
    assert sign_in.refused == "none of your groups gives a role in clusterui"
    assert sign_in.groups == ["finance", "everyone"]
    assert not User.objects.exists() and not Identity.objects.exists()


def test_someone_without_a_groups_claim_is_refused():
    body = claims()
    del body["groups"]
    assert sign_in_with_claims(body).refused


def test_a_known_user_removed_from_every_mapped_group_loses_their_role_audited():
    user = sign_in_with_claims(claims(groups=["platform-oncall"])).user
    sign_in = sign_in_with_claims(claims(groups=["finance"]))
    assert sign_in.refused and sign_in.user is None
    assert role_of(User.objects.get(pk=user.pk)) is None
    entry = AuditEntry.objects.get(action="user.sign_in_refused")
    assert entry.actor == user
    assert entry.changes["role"] == {"before": "operator", "after": None}
    assert entry.changes["groups"] == ["finance"]


def test_a_disabled_user_is_refused_even_in_a_mapped_group():
    user = sign_in_with_claims(claims()).user
    User.objects.filter(pk=user.pk).update(is_active=False)
    assert sign_in_with_claims(claims()).refused == "your clusterui account is disabled"


def test_the_groups_claim_is_the_configured_one_and_may_be_one_string(settings):
    settings.CLUSTERUI_OIDC_GROUPS_CLAIM = "roles"
    body = claims(groups=["platform-admins"], roles="platform-oncall")
    assert sign_in_with_claims(body).role == Role.OPERATOR


# --- The backend around it: ID token checks and userinfo ---------------------------------

def backend_for(request):
    backend = OIDCBackend()
    backend.request = request
    return backend


def test_an_id_token_from_the_configured_issuer_to_this_client_is_accepted():
    token = id_token(iss=ISSUER, aud=[CLIENT_ID, "other"], sub="s", nonce="n")
    assert OIDCBackend().verify_token(token, nonce="n")["sub"] == "s"


@pytest.mark.parametrize("changes, message", [
    ({"iss": "https://evil.example.com"}, "issuer"),
    ({"aud": "another-client"}, "issued to"),
    ({"nonce": "replayed"}, "Nonce"),
])
def test_an_id_token_for_someone_else_is_refused(changes, message):
    token = id_token(**{"iss": ISSUER, "aud": CLIENT_ID, "sub": "s", "nonce": "n", **changes})
    with pytest.raises(SuspiciousOperation, match=message):
        OIDCBackend().verify_token(token, nonce="n")


def test_an_id_token_signed_with_another_key_is_refused():
    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    token = id_token(key=other_key, iss=ISSUER, aud=CLIENT_ID, sub="s", nonce="n")
    with pytest.raises(SuspiciousOperation):
        OIDCBackend().verify_token(token, nonce="n")


def test_groups_from_the_id_token_count_when_userinfo_has_none():
    # Entra ID: groups in the ID token only.
    request = RequestFactory().get("/oidc/callback/")
    id_claims = claims(groups=["platform-admins"])
    userinfo = {"sub": id_claims["sub"], "email": "olivia@example.com", "name": "Olivia"}
    backend = backend_for(request)
    with mock.patch.object(OIDCBackend, "get_userinfo", return_value=userinfo):
        user = backend.get_or_create_user("access", "id-token", id_claims)
    assert role_of(User.objects.get(pk=user.pk)) == Role.ADMIN
    assert User.objects.get(pk=user.pk).email == "olivia@example.com"
    assert request.oidc_sign_in.user == user


def test_userinfo_for_another_sub_is_refused():
    request = RequestFactory().get("/oidc/callback/")
    with mock.patch.object(OIDCBackend, "get_userinfo", return_value={"sub": "someone-else"}):
        with pytest.raises(SuspiciousOperation, match="another sub"):
            backend_for(request).get_or_create_user("access", "id-token", claims())
    assert not User.objects.exists()
