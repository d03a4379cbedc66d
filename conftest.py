"""Personas shared by every app's tests (healthchecks.io style): one user per role, and one
signed-in user who holds no role at all."""

import pytest

from clusterui.roles import Role
from clusterui.tests.factories import ClusterFactory, UserFactory


@pytest.fixture
def cluster(db):
    return ClusterFactory(name="prod-h200", slug="prod-h200")


@pytest.fixture
def viewer(db):
    return UserFactory(username="vera", role=Role.VIEWER)


@pytest.fixture
def operator(db):
    return UserFactory(username="alice", role=Role.OPERATOR)


@pytest.fixture
def admin(db):
    return UserFactory(username="ada", role=Role.ADMIN)


@pytest.fixture
def outsider(db):
    """Signed in, but in none of the role groups."""
    return UserFactory(username="otto")


@pytest.fixture
def client_for(client):
    """client_for(user): the test client signed in as that user."""

    def sign_in(user):
        client.force_login(user)
        return client

    return sign_in
