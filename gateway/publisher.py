"""The live publisher: the only thing that pushes to browsers and offers work to agents.

One asyncio task per server process flushes that process's live-store buffer every 50 ms.
One of them leads (in production, the holder of a Redis lease, which a server process with
CLUSTERUI_PUBLISHER_LEADS=false never takes, and `manage.py publisher` always may; in
embedded mode, the only one), and
- once a second and for each cluster: reads the fold of the live samples
  (nodes/live_fold.py: sums kept as samples arrive, not every node's sample read again;
  in production the leader folds every process's samples, nodes/live_store.py),
  builds the summary, sends it to the browsers' group `cluster.<slug>`, adds the tick to the
  minute's ClusterRollup, writes `last_seen` of the nodes heard from since the last tick
  and the ended minute's NodeRollup rows, and runs the slow GPU rule
  (healthchecks/slow_gpus.py) over the GPUs at load;
- every FEED_EVERY_S: reads the change feed (clusters/change_feed.py), whoever wrote it (a
  view, a consumer, a Celery worker), and pushes it: one "health.changed",
  "repair.changed" or "check.changed" per cluster however many rows, and to a node's agent
  connection the work queued for it ("work.offer"), a new config ("config.changed") or
  that its token was revoked or its node removed ("agent.access").
Agent connections never group_send (PROTOCOL.md traffic stays inside the process that
received it).
"""

import asyncio
import logging
import math
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone as dt_timezone

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Max

from clusters.change_feed import Kind, read_changes
from clusters.models import Cluster
from common.bulk_sql import column, one_of, select, table, update_rows
from common.groups import agent_group, cluster_group
from common.stop_signals import stop_on_signals
from healthchecks.slow_gpu_events import (
    GPU_MODELS_REFRESH_S,
    read_slow_gpu_facts,
    record_slow_gpus,
    slow_gpu_limits,
)
from healthchecks.slow_gpus import SlowGpuWatch

from nodes.agent_work import parse_offer
from nodes.choices import NodeState
from nodes.live_fold import ClusterMinute
from nodes.live_store import get_live_store, stale_after_s
from nodes.models import Node, NodeTransition, PublisherStatus
from nodes.rollups import write_cluster_rollups, write_node_rollups

logger = logging.getLogger(__name__)

FLUSH_EVERY_S = 0.05  # the most a sample waits for its flush (ingest latency, bench/README.md)
PUBLISH_EVERY_S = 1.0
FEED_EVERY_S = 0.2
LEASE_KEY = "clusterui:publisher"
LEASE_MS = 3000
# Take the lease if it is free, or renew it if it is ours, in one step: between a read and a
# renewal the lease could pass to another process, whose lease the renewal would extend.
TAKE_OR_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('pexpire', KEYS[1], ARGV[2])
end
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
"""
RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""
FEED_READER = "publisher"
# The publisher's database work and its arithmetic over the fleet run here, off the event
# loop: the tick and the change feed at once, never more threads (nor connections) than that.
PUBLISHER_THREADS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="publisher")


def on_publisher_threads(func):
    """`func` as a coroutine function run on PUBLISHER_THREADS, database connections handled
    as database_sync_to_async does (closed after, where a request would close them)."""
    return database_sync_to_async(func, thread_sensitive=False, executor=PUBLISHER_THREADS)


def read_cluster_facts():
    """Per cluster: slug, status, state counts and the newest timeline row (one query each,
    per tick)."""
    clusters = {c.pk: {"slug": c.slug, "status": c.status, "status_reason": c.status_reason,
                       "counts": {s: 0 for s in NodeState.values}, "timeline_head": 0}
                for c in Cluster.objects.only("slug", "status", "status_reason")}
    for row in Node.objects.values("cluster_id", "state").annotate(n=Count("id")):
        if row["cluster_id"] in clusters and row["state"]:
            clusters[row["cluster_id"]]["counts"][row["state"]] = row["n"]
    for row in NodeTransition.objects.values("cluster_id").annotate(head=Max("id")):
        if row["cluster_id"] in clusters:
            clusters[row["cluster_id"]]["timeline_head"] = row["head"]
    return clusters


def record_tick(seen, now, *, just_started):
    """The publisher ran at `now`; seen: {node_id: unix time of its latest frame}.

    last_seen is the frame's time rounded UP to a tenth of a second, never earlier than the
    frame (a node is never judged silent early). It is written before the publisher's own
    status, in one transaction: a heartbeat sweep never sees this tick's time with last
    tick's last_seen. Three statements however many nodes were heard (common.bulk_sql): the
    nodes' rows are held only that long, and the event writer that waits on them briefly.
    """
    rows = sorted((node_id, datetime.fromtimestamp(math.ceil(received_at * 10) / 10,
                                                   tz=dt_timezone.utc))
                  for node_id, received_at in seen.items())
    with transaction.atomic():
        if rows and connection.features.has_select_for_update:
            # The rows locked first, in id order, as every writer of many nodes does: two
            # transactions never each hold a node the other waits for.
            where, params = one_of(Node, "id", list(seen))
            select(f"SELECT {column(Node, 'id')} FROM {table(Node)} WHERE {where} "
                   f"ORDER BY {column(Node, 'id')} FOR NO KEY UPDATE", params)
        update_rows(Node, ("last_seen",), rows)
        if just_started or not PublisherStatus.objects.filter(pk=1).update(seen_at=now):
            PublisherStatus.objects.update_or_create(pk=1, defaults={"started_at": now,
                                                                     "seen_at": now})


# What browsers hear of each kind of change, per cluster (other kinds go to agents, or
# show through the summary's timeline head).
BROWSER_MESSAGES = {
    Kind.HEALTH_EVENT: "health.changed",
    Kind.HEALTH_REPEAT: "health.changed",
    Kind.REPAIR: "repair.changed",
    Kind.CHECK_RUN: "check.changed",
}


def read_feed_messages():
    """(group, message) for what the change feed holds since the last read, coalesced: one
    message per cluster and type, one per piece of agent work, one config per node."""
    changes = read_changes(FEED_READER)
    if not changes:
        return []
    slugs = dict(Cluster.objects.filter(pk__in={c.cluster_id for c in changes})
                 .values_list("pk", "slug"))
    messages = {}
    for change in changes:
        if change.kind in BROWSER_MESSAGES and change.cluster_id in slugs:
            slug = slugs[change.cluster_id]
            kind = BROWSER_MESSAGES[change.kind]
            messages[(cluster_group(slug), kind)] = {"type": kind, "cluster": slug}
        elif change.kind == Kind.AGENT_WORK and change.node_id is not None:
            name, work_id = parse_offer(change.object_id)
            messages[(agent_group(change.node_id), name, work_id)] = {
                "type": "work.offer", "kind": name, "id": work_id}
        elif change.kind == Kind.AGENT_CONFIG and change.node_id is not None:
            messages[(agent_group(change.node_id), "config")] = {"type": "config.changed"}
        elif change.kind == Kind.AGENT_ACCESS and change.node_id is not None:
            messages[(agent_group(change.node_id), "access")] = {"type": "agent.access"}
    return [(key[0], message) for key, message in messages.items()]


def build_summary(slug, facts, usage, now_ts):
    return {
        "cluster": slug,
        "at": now_ts,
        "status": facts["status"],
        "status_reason": facts["status_reason"],
        "counts": facts["counts"],
        "timeline_head": facts["timeline_head"],
        "usage": None if usage is None else {
            "gpus_reporting": usage["gpus_reporting"],
            "gpu_util_pct": round(usage["gpu_util_pct"], 1),
            "gpu_mem_used_pct": round(usage["gpu_mem_used_pct"], 1),
            "net_gbps": round(usage["net_bps"] * 8 / 1e9, 2),
            "gpu_sm_active_pct": (None if usage["gpu_sm_active_pct"] is None
                                  else round(usage["gpu_sm_active_pct"], 1)),
        },
    }


class Publisher:
    def __init__(self, store=None, channel_layer=None, may_lead=None):
        self.store = store or get_live_store()
        # `manage.py publisher` always may; a server process as CLUSTERUI_PUBLISHER_LEADS says.
        self.may_lead = settings.CLUSTERUI_PUBLISHER_LEADS if may_lead is None else may_lead
        self.channel_layer = channel_layer or get_channel_layer()
        self.cluster_minute = ClusterMinute()
        self.slow_gpus = SlowGpuWatch(slow_gpu_limits())
        self.gpu_models, self.gpu_models_read_at = {}, None
        self.leading = False
        self.start_pending = False
        self.identity = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"

    async def run(self):
        """Flush every 50 ms; once a second, the leader's tick in a task of its own, so that
        its database work never holds up the flushes (ingest latency). Cancelled (a stopping
        process), it cancels the tick and the feed it started: none of them reads the samples
        or pushes once the lease is given up."""
        next_publish = next_feed = time.monotonic()
        tick = feed = None
        try:
            while True:
                try:
                    await self.store.flush()
                except Exception:
                    logger.exception("live store flush failed; retrying")
                now = time.monotonic()
                if now >= next_publish:
                    next_publish = max(next_publish + PUBLISH_EVERY_S, now)
                    # The lease is renewed every second, also while a long tick (the
                    # minute's rollups) still runs: leadership never lapses for being busy.
                    if await self.renew_lease():
                        self.start_pending = True  # the next tick marks the (re)start
                    if self.leading and (tick is None or tick.done()):
                        tick = asyncio.create_task(self.tick(self.start_pending))
                        self.start_pending = False
                if self.leading and now >= next_feed and (feed is None or feed.done()):
                    next_feed = now + FEED_EVERY_S
                    feed = asyncio.create_task(self.push_changes())
                await asyncio.sleep(FLUSH_EVERY_S)
        finally:
            started = [task for task in (tick, feed) if task is not None]
            for task in started:
                task.cancel()
            await asyncio.gather(*started, return_exceptions=True)

    async def renew_lease(self):
        """Whether this process leads now; True when it has just become the leader."""
        was_leading = self.leading
        try:
            self.leading = await self.holds_lease()
        except Exception:
            logger.exception("renewing the publisher's lease failed; not leading")
            self.leading = False
        self.store.set_leading(self.leading)
        return self.leading and not was_leading

    async def tick(self, just_started):
        try:
            await self.publish_once(just_started=just_started)
        except Exception:
            logger.exception("live publisher tick failed; retrying")

    async def push_changes(self):
        """What the change feed holds since the last read, to browsers and agents."""
        try:
            messages = await on_publisher_threads(read_feed_messages)()
            for group, message in messages:
                await self.channel_layer.group_send(group, message)
        except Exception:
            logger.exception("pushing the change feed failed; retrying")

    async def holds_lease(self):
        """Production: one publisher in the whole deployment, by a Redis lease it renews."""
        if not settings.REDIS_URL:
            return True
        if not self.may_lead:
            return False
        held = await self.store.client.eval(TAKE_OR_RENEW, 1, LEASE_KEY, self.identity, LEASE_MS)
        return bool(held)

    async def release_lease(self):
        """Give the lease up at once if this process holds it (a stopping process; also when
        its last renewal was cut short): another takes it within a second, not when it
        expires."""
        if settings.REDIS_URL:
            await self.store.client.eval(RELEASE, 1, LEASE_KEY, self.identity)
        self.leading = False

    async def write_node_minute(self, now=None):
        """Write the minute of the samples folded here (the leader's), once it has ended."""
        try:
            finished = self.store.node_minute.finish_if_new_minute(
                now or datetime.now(tz=dt_timezone.utc))
            if finished:
                await on_publisher_threads(write_node_rollups)(*finished)
        except Exception:
            logger.exception("writing the minute's node rollups failed")

    async def publish_once(self, now=None, just_started=False):
        now = now or datetime.now(tz=dt_timezone.utc)
        now_ts = now.timestamp()
        clusters = await on_publisher_threads(read_cluster_facts)()
        models_due = (self.gpu_models_read_at is None
                      or abs(now_ts - self.gpu_models_read_at) >= GPU_MODELS_REFRESH_S)
        open_slow, models = await on_publisher_threads(read_slow_gpu_facts)(models_due)
        if models is not None:
            self.gpu_models, self.gpu_models_read_at = models, now_ts
        fold = await self.store.read_fold()
        seen, openings, closings = {}, [], []
        for cluster_id, facts in clusters.items():
            # On the event loop, where the samples are recorded into the fold: the work here
            # grows with what changed since the last tick, not with the fleet.
            cluster_fold = fold.cluster(cluster_id)
            cluster_fold.expire(now_ts - stale_after_s())
            usage = cluster_fold.usage()
            seen.update(cluster_fold.take_heard())
            summary = build_summary(facts["slug"], facts, usage, now_ts)
            await self.channel_layer.group_send(
                cluster_group(facts["slug"]), {"type": "cluster.summary", "summary": summary})
            finished = self.cluster_minute.add(cluster_id, usage, now)
            if finished:
                await on_publisher_threads(write_cluster_rollups)(*finished)
            # The rule compares every GPU at load: in a worker thread, off the event loop.
            opened, closed = await on_publisher_threads(self.slow_gpus.check)(
                cluster_id, cluster_fold.gpus_at_load(), self.gpu_models, open_slow, now_ts)
            openings += opened
            closings += closed
        await self.write_node_minute(now)
        await on_publisher_threads(record_tick)(seen, now, just_started=just_started)
        if openings or closings:
            await on_publisher_threads(record_slow_gpus)(openings, closings, now)
        return clusters


_task = None


def ensure_publisher():
    """Start this process's publisher on the running event loop, once."""
    global _task
    if not settings.CLUSTERUI_PUBLISHER:
        return
    loop = asyncio.get_running_loop()
    if _task is not None and not _task.done() and _task.get_loop() is loop:
        return
    _task = loop.create_task(Publisher().run(), name="clusterui-live-publisher")


async def run_publisher_process(stop=None):
    """`manage.py publisher`: the publisher alone, in a process of its own, until SIGTERM or
    SIGINT (or `stop`, an asyncio.Event, in tests). Production only: it leads through the
    Redis lease, and folds the samples the agent-serving processes send through Redis."""
    stop = stop_on_signals(stop)
    publisher = Publisher(may_lead=True)
    task = asyncio.create_task(publisher.run(), name="clusterui-live-publisher")
    await stop.wait()
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    try:
        await publisher.release_lease()
    finally:
        await publisher.store.close()
