import os
from urllib.parse import urlsplit, urlunsplit

import pytest

from nodes.live import get_live_store, reset_live_store
from nodes.services import do_issue_join_token


@pytest.fixture
def in_memory_channel_layer(settings):
    """The channel layer in this process's memory, and no publisher of its own (tested on
    its own in test_live.py): the agent-socket tests run without Redis."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.CLUSTERUI_PUBLISHER = False


@pytest.fixture
def join_token(cluster):
    return do_issue_join_token(cluster)[1]


@pytest.fixture
def redis_live_store(settings):
    """A function that switches the test to production's live store: each call gives a new
    RedisLiveStore (as another server process has) on Redis database 15, which is emptied
    afterwards. Skipped without the REDIS_URL that `make test` sets."""
    import redis

    if not os.environ.get("REDIS_URL"):  # (a test's fixture may have cleared the setting)
        pytest.skip("needs Redis: run it with `make test`")
    url = urlunsplit(urlsplit(os.environ["REDIS_URL"])._replace(path="/15"))

    def production_store():
        settings.REDIS_URL = url
        reset_live_store()
        return get_live_store()

    yield production_store
    reset_live_store()
    with redis.Redis.from_url(url) as client:
        client.flushdb()
