import pytest

from clusters.roles import Role
from clusters.tests.factories import UserFactory
from notifications.services import do_create_channel

from .receivers import http_receiver, smtp_receiver  # noqa: F401 (fixtures)


@pytest.fixture
def setter(db):
    return UserFactory(username="channel-setter", role=Role.ADMIN)


@pytest.fixture
def make_channel(cluster, setter):
    """make_channel(url, kinds=[...], kind="apprise", **timing) -> (channel, signing key)."""
    def make(url, kinds=("repair_awaiting_approval",), kind="apprise", rules=None, name=None,
             **timing):
        rules = rules or [{"kind": k} for k in kinds]
        return do_create_channel(cluster, name=name or f"channel-{kind}", kind=kind, url=url,
                                 rules=rules, actor=setter, **timing)
    return make
