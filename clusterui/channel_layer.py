"""The channel layer of production mode: channels-redis's, over a Redis connection pool that
waits for a free connection instead of failing.

redis-py (6 and later) caps an asyncio pool at 100 connections and raises
MaxConnectionsError at the 101st command in flight. A process's commands in flight grow with
its sockets: when a fleet's agents drop at once (a network partition, a load balancer's
restart), every connection leaves its node's group in the same moment, and the bench's
2,000-node storm saw 738 of them fail, their group memberships left behind, and the
publisher's push of the change feed fail with them. Here the 101st waits for one of the
100 to come back (BlockingConnectionPool), which in a storm takes milliseconds.
"""

import redis.asyncio
from channels_redis.core import RedisChannelLayer as ChannelsRedisLayer

MAX_CONNECTIONS = 100  # per process and Redis host, as redis-py's own default
WAIT_FOR_CONNECTION_S = 20


class RedisChannelLayer(ChannelsRedisLayer):
    def create_pool(self, index):
        host = dict(self.hosts[index])
        if "address" not in host:  # Sentinel, or a pool's own arguments: channels-redis's way
            return super().create_pool(index)
        return redis.asyncio.BlockingConnectionPool.from_url(
            host.pop("address"), max_connections=MAX_CONNECTIONS,
            timeout=WAIT_FOR_CONNECTION_S, **host)
