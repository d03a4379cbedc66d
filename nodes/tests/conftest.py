import os
from urllib.parse import urlsplit, urlunsplit

import pytest

from nodes.live_store import get_live_store, reset_live_store


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
