"""Production's channel layer (clusterui/channel_layer.py) against a real Redis: a fleet's
connections leaving their groups all at once wait for the pool's connections instead of
failing."""

import asyncio
import os
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from channels_redis.core import RedisChannelLayer as ChannelsRedisLayer
from redis.exceptions import MaxConnectionsError

from clusterui.channel_layer import MAX_CONNECTIONS, RedisChannelLayer

AT_ONCE = 4 * MAX_CONNECTIONS  # more commands in flight than the pool has connections


@pytest.fixture
def redis_url():
    if not os.environ.get("REDIS_URL"):
        pytest.skip("needs Redis: run it with `make test`")
    url = urlunsplit(urlsplit(os.environ["REDIS_URL"])._replace(path="/14"))
    yield url
    with redis.Redis.from_url(url) as client:
        client.flushdb()


async def leave_groups_at_once(layer):
    """The errors of AT_ONCE connections joining their groups at once, then leaving them."""
    channels = [await layer.new_channel() for _ in range(AT_ONCE)]
    joined = await asyncio.gather(*(layer.group_add(f"agent-{n}", channel)
                                    for n, channel in enumerate(channels)),
                                  return_exceptions=True)
    left = await asyncio.gather(*(layer.group_discard(f"agent-{n}", channel)
                                  for n, channel in enumerate(channels)),
                                return_exceptions=True)
    return [outcome for outcome in joined + left if isinstance(outcome, BaseException)]


def memberships(redis_url):
    with redis.Redis.from_url(redis_url) as client:
        return list(client.scan_iter(b"*group*"))


@pytest.mark.asyncio
async def test_a_fleet_leaving_its_groups_at_once_waits_for_the_pool(redis_url):
    layer = RedisChannelLayer(hosts=[{"address": redis_url, "socket_timeout": 10}])
    assert await leave_groups_at_once(layer) == []
    pool = layer.connection(0).connection_pool
    assert len(pool._in_use_connections) + len(pool._available_connections) <= MAX_CONNECTIONS
    assert memberships(redis_url) == []


@pytest.mark.asyncio
async def test_channels_redis_own_pool_fails_there(redis_url):
    """Why the layer exists: the same storm on channels-redis's own pool (redis-py's default
    of 100 connections, raising past it) fails commands: a group left that way keeps its
    member until the group expires (channels-redis: a day). If
    this starts failing, redis-py or channels-redis changed, and clusterui/channel_layer.py
    may go."""
    layer = ChannelsRedisLayer(hosts=[{"address": redis_url, "socket_timeout": 10}])
    errors = await leave_groups_at_once(layer)
    assert errors and all(isinstance(error, MaxConnectionsError) for error in errors)
