"""For the sign-in tests: OpenID Connect turned on through the `settings` fixture, and ID
tokens signed with a key made here (the backend checks them with its public half, as it
would with a key from the provider's JWKS)."""

import time

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

ISSUER = "https://idp.example.com"
CLIENT_ID = "clusterui"
ROLE_GROUPS = "admin=platform-admins,operator=platform-oncall,viewer=ml-engineers;researchers"
SIGNING_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
PUBLIC_KEY_PEM = SIGNING_KEY.public_key().public_bytes(
    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def enable_oidc(settings, **overrides):
    """What clusterui.settings sets from CLUSTERUI_OIDC_* variables, for one test."""
    values = {
        "CLUSTERUI_OIDC_ENABLED": True,
        "CLUSTERUI_OIDC_ISSUER": ISSUER,
        "OIDC_OP_AUTHORIZATION_ENDPOINT": f"{ISSUER}/authorize",
        "OIDC_OP_TOKEN_ENDPOINT": f"{ISSUER}/token",
        "OIDC_OP_USER_ENDPOINT": f"{ISSUER}/userinfo",
        "OIDC_OP_JWKS_ENDPOINT": f"{ISSUER}/jwks",
        "CLUSTERUI_OIDC_END_SESSION_ENDPOINT": f"{ISSUER}/logout",
        "CLUSTERUI_OIDC_CLIENT_ID": CLIENT_ID,
        "OIDC_RP_CLIENT_ID": CLIENT_ID,
        "OIDC_RP_CLIENT_SECRET": "client-secret",
        "OIDC_RP_SCOPES": "openid email profile groups",
        "CLUSTERUI_OIDC_GROUPS_CLAIM": "groups",
        "CLUSTERUI_OIDC_ROLE_GROUPS": ROLE_GROUPS,
        "AUTHENTICATION_BACKENDS": ["clusters.oidc.OIDCBackend",
                                    "django.contrib.auth.backends.ModelBackend"],
        # The provider's key, given directly instead of fetched from OIDC_OP_JWKS_ENDPOINT.
        "OIDC_RP_IDP_SIGN_KEY": PUBLIC_KEY_PEM,
    }
    values.update(overrides)
    for name, value in values.items():
        setattr(settings, name, value)


def claims(sub="sub-olivia", groups=("platform-oncall",), **extra):
    return {"iss": ISSUER, "sub": sub, "aud": CLIENT_ID, "email": f"{sub}@example.com",
            "preferred_username": sub.removeprefix("sub-"), "groups": list(groups), **extra}


def id_token(key=SIGNING_KEY, **token_claims):
    now = int(time.time())
    body = {"iat": now, "exp": now + 300, **token_claims}
    return jwt.encode(body, key, algorithm="RS256", headers={"kid": "test"})
