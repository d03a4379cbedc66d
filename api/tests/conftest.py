import pytest
from django.test import Client

from api.tokens import do_create_api_token
from clusters.roles import Role
from clusters.tests.factories import UserFactory


@pytest.fixture
def token_for(db):
    """token_for(role) -> (user, plaintext token) of a new user with that role (or None)."""
    def make(role, username=None):
        label = role.label if role is not None else "none"
        user = UserFactory(username=username or f"api-{label}", role=role)
        _, plaintext = do_create_api_token(user, name="tests", expires_in_days=30)
        return user, plaintext
    return make


class ApiClient:
    """A Django test client that sends a bearer token and JSON."""

    def __init__(self, token=None, address="10.9.8.7"):
        self.client = Client(REMOTE_ADDR=address)
        self.headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}

    def get(self, path, **params):
        return self.client.get(path, params, **self.headers)

    def post(self, path, body=None):
        return self.client.post(path, body or {}, content_type="application/json",
                                **self.headers)


@pytest.fixture
def api_as(token_for):
    def make(role):
        user, token = token_for(role)
        return ApiClient(token), user
    return make


__all__ = ["ApiClient", "Role"]
