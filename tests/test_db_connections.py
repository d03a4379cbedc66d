"""A server process holds no more PostgreSQL connections than its pool, however many requests
it served (clusterui/settings.py). Under ASGI every request runs in a thread of its own:
with persistent connections each one left a connection open, and a web process that had
served the reconnect bench held 87 of them until PostgreSQL refused new ones."""

from concurrent.futures import ThreadPoolExecutor

import psutil
from django.conf import settings

POOL_SIZE = 4


def database_connections(pid):
    port = int(settings.DATABASES["default"]["PORT"])
    return [c for c in psutil.Process(pid).net_connections(kind="tcp")
            if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED]


def test_requests_hand_their_connection_back_to_the_pool(processes):
    server = processes.daphne(CLUSTERUI_DB_POOL_SIZE=POOL_SIZE)

    statuses = [server.get("/healthz")[0] for _ in range(100)]
    with ThreadPoolExecutor(max_workers=16) as pool:
        statuses += list(pool.map(lambda _: server.get("/healthz")[0], range(200)))

    assert statuses == [200] * 300  # /healthz asks the database each time
    held = database_connections(server.pid)
    assert 1 <= len(held) <= POOL_SIZE, f"{len(held)} connections to PostgreSQL"
