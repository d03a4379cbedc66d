"""OpenID Connect sign-in (mozilla-django-oidc): who a user is, and which role they get.

A user is found by the ID token's issuer and sub (Identity), never by email or name. The
first sign-in creates the user with a readable username (preferred_username, else email,
else sub) that stays as it is afterwards, so the audit trail keeps one name per person;
name and email follow the IdP at every sign-in, and so does the role: the highest role any
of the user's groups maps to in CLUSTERUI_OIDC_ROLE_GROUPS. Someone in no mapped group is
refused, with a page that shows the groups the IdP sent and the groups that are mapped, and
loses the role they had here.

Silent renewals (clusterui.middleware.SignInRedirectMiddleware) come back through the same
callback, so a role removed at the IdP is removed here within CLUSTERUI_OIDC_RENEW_S.
"""

import functools
import logging
import re
from dataclasses import dataclass
from urllib.parse import urlencode

import requests
from django.conf import settings
from django.contrib import auth
from django.contrib.auth import REDIRECT_FIELD_NAME, get_user_model
from django.core.exceptions import ImproperlyConfigured, SuspiciousOperation
from django.db import transaction
from django.http import Http404
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.views import (
    OIDCAuthenticationCallbackView,
    OIDCAuthenticationRequestView,
)

from .models import Identity
from .roles import Role, assign_role, role_of
from .services import record_audit

logger = logging.getLogger(__name__)

# What went wrong at the last sign-in, for the page that says so (clusters.accounts).
FAILURE_SESSION_KEY = "clusterui_sign_in_failure"
# Answers to a silent renewal (prompt=none) that only mean: sign in on the provider's page.
INTERACTIVE_SIGN_IN_NEEDED = {
    "login_required", "interaction_required", "consent_required", "account_selection_required",
}
NOT_IN_A_USERNAME = re.compile(r"[^\w.@+-]")


@dataclass
class SignIn:
    """The outcome of a sign-in's claims: the user, or why they are refused."""

    issuer: str
    sub: str
    groups: list
    role: Role | None
    role_before: Role | None = None
    user: object = None
    created: bool = False
    refused: str = ""
    who: str = ""
    renewal: bool = False

    def audit_changes(self):
        return {
            "issuer": self.issuer,
            "sub": self.sub,
            "groups": self.groups,
            "role": {"before": role_label(self.role_before), "after": role_label(self.role)},
            "created": self.created,
            "renewal": self.renewal,
        }


def role_label(role):
    return role.label if role is not None else None


def groups_in(claims):
    """The user's IdP groups from the configured claim: a list, or one group as a string."""
    value = claims.get(settings.CLUSTERUI_OIDC_GROUPS_CLAIM)
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return [str(group) for group in value]
    return []


def parse_role_groups(name, value):
    """'admin=platform-admins,operator=platform-oncall,viewer=ml-engineers;researchers'
    -> {"platform-admins": "admin", "platform-oncall": "operator", ...}

    Roles are separated by commas, a role's IdP groups by semicolons. A group maps to one
    role; a user in several mapped groups gets the highest of their roles."""
    role_names = [role.group_name for role in Role]
    mapping, roles_seen = {}, set()
    for entry in (part.strip() for part in value.split(",")):
        if not entry:
            continue
        role, equals, groups = (part.strip() for part in entry.partition("="))
        if not equals:
            raise ImproperlyConfigured(f"{name}: {entry!r} is not role=group;group")
        if role not in role_names:
            raise ImproperlyConfigured(
                f"{name}: unknown role {role!r} in {entry!r} (roles: {', '.join(role_names)})")
        if role in roles_seen:
            raise ImproperlyConfigured(
                f"{name}: {role} is given twice; separate its groups with semicolons")
        roles_seen.add(role)
        for group in (g.strip() for g in groups.split(";")):
            if not group:
                raise ImproperlyConfigured(f"{name}: an empty group name in {entry!r}")
            if group in mapping:
                raise ImproperlyConfigured(
                    f"{name}: group {group!r} is mapped to both {mapping[group]} and {role}")
            mapping[group] = role
    if not mapping:
        raise ImproperlyConfigured(f"{name} maps no IdP group to a role")
    return mapping


def role_groups():
    """{IdP group: role name} from CLUSTERUI_OIDC_ROLE_GROUPS; {} without OpenID Connect."""
    spec = settings.CLUSTERUI_OIDC_ROLE_GROUPS
    return _parsed_role_groups(spec) if spec else {}


@functools.cache
def _parsed_role_groups(spec):
    return parse_role_groups("CLUSTERUI_OIDC_ROLE_GROUPS", spec)


def role_for_groups(groups):
    mapping = role_groups()
    return max((Role[mapping[group].upper()] for group in groups if group in mapping),
               default=None)


def mapped_groups_by_role():
    """{"admin": [...], "operator": [...], "viewer": [...]} for the refused page."""
    by_role = {role.label: [] for role in sorted(Role, reverse=True)}
    for group, role_name in role_groups().items():
        by_role[role_name].append(group)
    return by_role


def free_username(claims):
    """A readable username nobody has yet: preferred_username, else email, else sub, with
    -2, -3 ... after it when taken (a local account of that name is never taken over)."""
    wanted = claims.get("preferred_username") or claims.get("email") or claims["sub"]
    base = NOT_IN_A_USERNAME.sub("-", str(wanted))[:140] or "user"
    users = get_user_model().objects
    candidate, number = base, 1
    while users.filter(username__iexact=candidate).exists():
        number += 1
        candidate = f"{base}-{number}"
    return candidate


def update_profile(user, claims):
    given, family = claims.get("given_name"), claims.get("family_name")
    user.first_name = str(given or claims.get("name") or "")[:150]
    user.last_name = str(family or "")[:150] if given else ""
    user.email = str(claims.get("email") or "")[:254]
    user.save(update_fields=["first_name", "last_name", "email"])


def sign_in_with_claims(claims, *, request=None):
    """Find or create the user of these (verified) claims and give them the role their
    groups map to; or refuse them, taking away the role they had. Returns a SignIn."""
    issuer, sub = claims["iss"], str(claims["sub"])
    groups = groups_in(claims)
    sign_in = SignIn(issuer=issuer, sub=sub, groups=groups, role=role_for_groups(groups),
                     who=str(claims.get("email") or claims.get("preferred_username") or sub))
    with transaction.atomic():
        identity = (Identity.objects.select_for_update().select_related("user")
                    .filter(issuer=issuer, sub=sub).first())
        user = identity.user if identity is not None else None
        if user is not None:
            sign_in.role_before = role_of(user)
        if sign_in.role is None:
            sign_in.refused = "none of your groups gives a role in clusterui"
        elif user is not None and not user.is_active:
            sign_in.refused = "your clusterui account is disabled"
        if sign_in.refused:
            if user is not None and sign_in.role_before is not None and sign_in.role is None:
                assign_role(user, None)
                record_audit(user, "user.sign_in_refused", user, request=request,
                             changes=sign_in.audit_changes())
            return sign_in
        if identity is None:
            user = get_user_model().objects.create_user(free_username(claims))  # no password
            identity = Identity.objects.create(user=user, issuer=issuer, sub=sub)
            sign_in.created = True
        update_profile(user, claims)
        assign_role(user, sign_in.role)
        identity.last_sign_in_at = timezone.now()
        identity.save(update_fields=["last_sign_in_at"])
    sign_in.user = user
    return sign_in


class OIDCBackend(OIDCAuthenticationBackend):
    """mozilla-django-oidc's backend, keyed on iss and sub, with roles from the groups claim.

    mozilla-django-oidc checks the ID token's signature (RS256, the provider's JWKS), its
    expiry and the nonce; this also checks that the provider issued it to this client."""

    def verify_token(self, token, **kwargs):
        claims = super().verify_token(token, **kwargs)
        if claims.get("iss") != settings.CLUSTERUI_OIDC_ISSUER:
            raise SuspiciousOperation(
                f"the ID token's issuer is {claims.get('iss')!r}, and CLUSTERUI_OIDC_ISSUER "
                f"is {settings.CLUSTERUI_OIDC_ISSUER!r}")
        audience = claims.get("aud")
        audiences = [audience] if isinstance(audience, str) else list(audience or [])
        if settings.OIDC_RP_CLIENT_ID not in audiences:
            raise SuspiciousOperation(f"the ID token was issued to {audiences!r}, not to "
                                      f"this client ({settings.OIDC_RP_CLIENT_ID!r})")
        return claims

    def get_or_create_user(self, access_token, id_token, payload):
        userinfo = self.get_userinfo(access_token, id_token, payload)
        if str(userinfo.get("sub")) != str(payload.get("sub")):
            raise SuspiciousOperation("the userinfo endpoint answered for another sub")
        # Entra ID puts groups in the ID token only, Keycloak and Okta also in userinfo.
        claims = {**payload, **userinfo, "iss": payload["iss"]}
        sign_in = sign_in_with_claims(claims, request=self.request)
        self.request.oidc_sign_in = sign_in
        return sign_in.user


class AuthenticationRequestView(OIDCAuthenticationRequestView):
    """Sends the browser to the provider to sign in (with state, nonce and PKCE)."""

    def get(self, request):
        if not settings.CLUSTERUI_OIDC_ENABLED:
            raise Http404("OpenID Connect sign-in is not configured.")
        return super().get(request)


class CallbackView(OIDCAuthenticationCallbackView):
    """Where the provider sends the browser back: sign in, audit, or say why not."""

    def get(self, request):
        if not settings.CLUSTERUI_OIDC_ENABLED:
            raise Http404("OpenID Connect sign-in is not configured.")
        # A failed renewal logs the user out (and empties the session) before login_failure.
        self.next_url = request.session.get("oidc_login_next")
        try:
            return super().get(request)
        except SuspiciousOperation as error:
            logger.warning("OIDC sign-in refused: %s", error)
            return self.fail({"error": "invalid_response",
                              "description": f"The sign-in response failed a check: {error}"})
        except requests.RequestException as error:
            logger.error("OIDC provider request failed: %s", error)
            return self.fail({"error": "provider_request_failed",
                              "description": "The console's request to the identity provider "
                                             "failed; the console's log says why."})

    def login_success(self):
        renewal = self.request.user.is_authenticated and self.request.user == self.user
        response = super().login_success()
        sign_in = self.request.oidc_sign_in
        sign_in.renewal = renewal
        if not renewal or sign_in.role != sign_in.role_before:
            record_audit(self.user, "user.sign_in", self.user, request=self.request,
                         changes=sign_in.audit_changes())
        return response

    def login_failure(self):
        error = self.request.GET.get("error", "")
        if error in INTERACTIVE_SIGN_IN_NEEDED:
            # The silent renewal needs the provider's sign-in page: go there, then come back.
            query = f"?{urlencode({REDIRECT_FIELD_NAME: self.next_url})}" if self.next_url else ""
            return redirect(reverse("oidc_authentication_init") + query)
        sign_in = getattr(self.request, "oidc_sign_in", None)
        if sign_in is not None and sign_in.refused:
            return self.fail({"refused": sign_in.refused, "who": sign_in.who,
                              "groups": sign_in.groups, "issuer": sign_in.issuer})
        if error:
            return self.fail({"error": error,
                              "description": self.request.GET.get("error_description", "")})
        return self.fail({"error": "sign_in_failed",
                          "description": "The sign-in did not complete; please try again."})

    def fail(self, failure):
        """End any session, keep what went wrong for the page that says so, and go there."""
        if self.request.user.is_authenticated:
            auth.logout(self.request)
        self.request.session[FAILURE_SESSION_KEY] = failure
        return redirect(settings.LOGIN_REDIRECT_URL_FAILURE)


def provider_logout_url(request):
    """Where sign-out sends the browser (clusters.accounts.sign_out): the provider's
    end_session endpoint with the ID token as id_token_hint, which ends the IdP session and
    comes back to the signed-out page; without an endpoint or a token, that page directly."""
    signed_out = request.build_absolute_uri(reverse("signed_out"))
    endpoint = settings.CLUSTERUI_OIDC_END_SESSION_ENDPOINT
    id_token = request.session.get("oidc_id_token")
    if not (settings.CLUSTERUI_OIDC_ENABLED and endpoint and id_token):
        return signed_out
    query = urlencode({"id_token_hint": id_token, "post_logout_redirect_uri": signed_out,
                       "client_id": settings.OIDC_RP_CLIENT_ID})
    return f"{endpoint}{'&' if '?' in endpoint else '?'}{query}"
