"""Personas shared by every app's tests (healthchecks.io style): one user per role, and one
signed-in user who holds no role at all."""

import pytest

from clusters.roles import Role
from clusters.tests.factories import ClusterFactory, UserFactory
from nodes.services import do_issue_join_token


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


@pytest.fixture
def in_memory_channel_layer(settings):
    """The channel layer in this process's memory, and no publisher of its own (tested on
    its own in nodes/tests/test_live.py): the agent-socket tests run without Redis."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.CLUSTERUI_PUBLISHER = False


@pytest.fixture
def join_token(cluster):
    """A join token of the `cluster` fixture, in plain text."""
    return do_issue_join_token(cluster)[1]
