"""One beat per deployment: a second `celery beat` started by mistake stands by and sends
nothing (CELERY_BEAT_SCHEDULER).

The scheduler sends its due tasks only while it holds the deployment's beat lock, checked
and renewed at every tick: in production a Redis lock (LOCK_TTL_S, so a beat that died
hands over within that time; one that stops cleanly releases it at once), in embedded mode
an flock on a file in the data directory (released by the kernel when its process ends). A
beat without the lock logs that it stands by, asks again every STANDBY_POLL_S, and takes
over when the holder is gone: a standby, not a second sender.
"""

import fcntl
import logging
import os

from celery.beat import PersistentScheduler
from django.conf import settings

logger = logging.getLogger(__name__)

LOCK_TTL_S = 30
STANDBY_POLL_S = 2.0


class RedisBeatLock:
    def __init__(self, url, key):
        import redis

        self.client = redis.Redis.from_url(url, socket_timeout=5)
        self.lock = self.client.lock(key, timeout=LOCK_TTL_S, blocking=False,
                                     thread_local=False)

    def hold(self):
        """Whether this beat holds the lock now (taking it if free, renewing it if held)."""
        from redis.exceptions import LockError, RedisError

        try:
            if self.lock.owned():
                self.lock.reacquire()
                return True
            return self.lock.acquire(blocking=False)
        except LockError:
            return False
        except RedisError as exc:
            logger.warning("beat lock: Redis did not answer (%s); sending nothing", exc)
            return False

    def release(self):
        from redis.exceptions import LockError, RedisError

        try:
            if self.lock.owned():
                self.lock.release()
        except (LockError, RedisError):
            pass  # it expires by itself


class FileBeatLock:
    def __init__(self, path):
        self.path = path
        self.descriptor = None

    def hold(self):
        if self.descriptor is not None:
            return True
        descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            return False
        self.descriptor = descriptor
        return True

    def release(self):
        if self.descriptor is not None:
            os.close(self.descriptor)  # closing the file releases the flock
            self.descriptor = None


def beat_lock():
    """This deployment's beat lock: one per database."""
    if settings.REDIS_URL:
        name = settings.DATABASES["default"]["NAME"]
        return RedisBeatLock(settings.REDIS_URL,
                             settings.CLUSTERUI_BEAT_LOCK or f"clusterui:beat:{name}")
    settings.DATA_DIR.mkdir(parents=True, exist_ok=True)
    return FileBeatLock(settings.DATA_DIR / "beat.lock")


class SingleBeatScheduler(PersistentScheduler):
    def __init__(self, *args, **kwargs):
        self.beat_lock = beat_lock()
        self.standing_by = None
        super().__init__(*args, **kwargs)

    def tick(self, *args, **kwargs):
        if not self.beat_lock.hold():
            if self.standing_by is not True:
                logger.warning("beat: another beat holds this deployment's lock; standing by "
                               "(sending nothing) until it stops")
            self.standing_by = True
            return STANDBY_POLL_S
        if self.standing_by is not False:
            logger.info("beat: holding this deployment's lock; sending the schedule")
        self.standing_by = False
        return super().tick(*args, **kwargs)

    def close(self):
        try:
            super().close()
        finally:
            self.beat_lock.release()
