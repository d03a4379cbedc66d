"""The agent WebSocket (/ws/agent/): PROTOCOL.md's server side.

Thin: it authenticates, validates each frame (gateway.protocol), and hands hellos to
gateway.ingest in a worker thread and events to the process's batch writer
(gateway.event_batches). Samples never touch the database.
"""

import asyncio
import json
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import DatabaseError, InterfaceError
from redis.exceptions import RedisError

from common.groups import agent_group

from . import ingest, reconnects
from .frame_limits import FrameBucket, HelloAdmission, NewEventCounts
from .event_batches import event_writer
from nodes.live_store import get_live_store
from .protocol import (MAX_FRAME_BYTES, BadFrame, FastSample, as_fast_sample, exact_frame,
                       fast_sample, known_hygiene, live_sample, quick_read)
from .publisher import ensure_publisher
from .series import AGENTS_CONNECTED, EVENT_ACK_SECONDS, HELLOS_IN_HAND, RATE_LIMITED

logger = logging.getLogger(__name__)

BAD_FRAME_LIMIT = 20
BAD_FRAME_WINDOW_S = 60.0

CLOSE_BAD_TOKEN = 4401
CLOSE_TOO_MANY_BAD_FRAMES = 4400
CLOSE_REPLACED = 4409
CLOSE_TOO_BIG = 1009
CLOSE_RATE_LIMITED = 4429

# The agents' database work runs on threads of the gateway's own, never on the one thread
# that Django's sync views share (database_sync_to_async's default): people's pages never
# wait behind a fleet's reconnects. After a server restart thousands of agents connect at
# once: their token checks and known hellos (gateway.reconnects, a few ms each) never wait
# behind the hellos that take the full path (joins, reboots, a changed inventory), which
# have threads of their own and a bound on how many are in hand. The event writer has its
# own thread (gateway.event_batches).
AGENT_THREADS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="agent-db")
FULL_HELLO_THREADS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="agent-full-hello")

# In hand: known hellos take a few ms each; full ones tens of ms on FULL_HELLO_THREADS, so
# 64 of those are a few seconds of work. A refused hello is told when its turn should come
# (HelloAdmission.retry_after).
HELLOS = HelloAdmission(limit=256, seconds_of_work=2.0)
FULL_HELLOS = HelloAdmission(limit=64, seconds_of_work=4.0)
HELLOS_IN_HAND.labels("all").set_function(lambda: HELLOS.in_hand)
HELLOS_IN_HAND.labels("full").set_function(lambda: FULL_HELLOS.in_hand)
NEW_EVENTS = NewEventCounts()
# An event is acked once its batch is stored; meanwhile the connection reads on (a burst of
# events goes into one batch). At most this many of a connection's events wait so.
EVENTS_IN_FLIGHT = 200
# Refusals less than this far apart are one stretch of going on past rate_limited (4429).
RATE_LIMITED_GAP_S = 10.0


def on_agent_threads(func):
    """`func` as a coroutine function run on AGENT_THREADS, database connections handled as
    database_sync_to_async does."""
    return database_sync_to_async(func, thread_sensitive=False, executor=AGENT_THREADS)


def on_full_hello_threads(func):
    return database_sync_to_async(func, thread_sensitive=False, executor=FULL_HELLO_THREADS)


# What the channel layer raises while Redis is away (channels_redis, redis-py).
LAYER_ERRORS = (RedisError, OSError)
LAYER_RETRY_MAX_S = 5.0
# What Django raises while PostgreSQL is away (a connection refused, or one that broke).
DATABASE_ERRORS = (DatabaseError, InterfaceError)
LAYER_MESSAGE_TRIES = 6  # 0.25 ... 4 s apart: about 8 s

# The connection's grant when the database could not be asked at connect.
TOKEN_NOT_CHECKED = object()


def bearer_token(scope):
    for name, value in scope.get("headers", []):
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                return token.strip()
    return None


class AgentConsumer(AsyncWebsocketConsumer):
    grant = None
    node_id = None
    closed = False

    async def connect(self):
        ensure_publisher()
        self.bad_frames = deque()
        self.frame_bucket = FrameBucket(settings.CLUSTERUI_AGENT_FRAMES_PER_S,
                                        settings.CLUSTERUI_AGENT_FRAME_BURST)
        self.limited_since = self.last_limited = None
        self.events_in_flight = set()  # tasks storing this connection's events
        self.memory_totals = {}
        self.hygiene = None  # the latest sample.hygiene on this connection (nodes.live_store)
        self.live_store = get_live_store()
        self.token = bearer_token(self.scope)
        try:
            self.grant = await on_agent_threads(reconnects.authenticate)(self.token)
        except DATABASE_ERRORS as exc:  # the hello checks it again
            logger.warning("agent token not checked at connect (%s); it is at the hello", exc)
            self.grant = TOKEN_NOT_CHECKED
        await self.accept()
        if self.grant is None:
            await self.close_with(CLOSE_BAD_TOKEN)

    async def __call__(self, scope, receive, send):
        """AsyncConsumer.__call__, without its await_many_dispatch(): that makes a new Task for
        every message and waits on it and on the channel layer with asyncio.wait(). Here the
        connection's messages are awaited directly, and one task reads the channel layer. As
        there, one message is handled at a time, and an error in handling one ends the consumer.
        """
        self.scope = scope
        self.base_send = send
        self.channel_layer = get_channel_layer(self.channel_layer_alias)
        self._one_at_a_time = asyncio.Lock()
        self._layer_error = None
        from_layer = None
        if self.channel_layer is not None:
            self.channel_name = await self.channel_layer.new_channel()
            from_layer = asyncio.ensure_future(self._dispatch_from_layer(asyncio.current_task()))
        try:
            while True:
                message = await receive()
                async with self._one_at_a_time:
                    if message["type"] == "websocket.receive":  # most messages: a frame
                        await self.receive(message.get("text"), message.get("bytes"))
                    else:
                        await self.dispatch(message)
        except StopConsumer:
            pass
        except asyncio.CancelledError:
            if self._layer_error is None:
                raise
            if not isinstance(self._layer_error, StopConsumer):
                raise self._layer_error from None
        finally:
            if from_layer is not None:
                from_layer.cancel()
                try:
                    await from_layer
                except asyncio.CancelledError:
                    pass

    async def _dispatch_from_layer(self, consumer_task):
        """The channel layer's messages (work offers, config changes, a replacement), one at
        a time with the connection's. Redis going away does not end the connection: the
        agent's frames need only the database. Once Redis is back, the connection joins
        its node's group again (a restarted Redis forgot it) and sends the work queued
        meanwhile (its offers were lost)."""
        failures = 0
        try:
            while True:
                try:
                    if failures:
                        async with self._one_at_a_time:
                            await self.rejoin()
                    message = await self.channel_layer.receive(self.channel_name)
                except LAYER_ERRORS as exc:
                    if failures == 0:
                        logger.warning("channel layer unreachable (%s); the agent connection "
                                       "stays, retrying", exc)
                    await asyncio.sleep(min(LAYER_RETRY_MAX_S, 0.25 * 2 ** failures))
                    failures += 1
                    continue
                if failures:
                    logger.info("channel layer reachable again after %d tries", failures)
                    failures = 0
                await self._dispatch_layer_message(message)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer's task, as Channels does
            self._layer_error = exc
            consumer_task.cancel()

    async def _dispatch_layer_message(self, message):
        """A message from the layer that fails (a work offer while the database is away) is
        tried again for a while; after that the connection ends, and the agent's next hello
        gets all its queued work."""
        for attempt in range(LAYER_MESSAGE_TRIES):
            try:
                async with self._one_at_a_time:
                    await self.dispatch(message)
                return
            except Exception:  # noqa: BLE001 - tried again, then it ends the connection
                if attempt == LAYER_MESSAGE_TRIES - 1:
                    raise
                if attempt == 0:
                    logger.exception("%s for node %s failed; trying again", message["type"],
                                     self.node_id)
                await asyncio.sleep(min(LAYER_RETRY_MAX_S, 0.25 * 2 ** attempt))

    async def dispatch(self, message):
        # Channels closes stale database connections before every message: a hop to a worker
        # thread per sample. This consumer reaches the database only through
        # database_sync_to_async, which does that itself, so it skips the hop
        # (shared/notes/ingest-performance.md: 30-45 % of the CPU per frame). A frame, most
        # messages, goes straight to receive() from __call__, as websocket_receive() would
        # send it.
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def rejoin(self):
        """After the channel layer was lost: the node's group again, and its queued work."""
        if self.node_id is None or self.closed:
            return
        await self.channel_layer.group_add(agent_group(self.node_id), self.channel_name)
        for work in await on_agent_threads(ingest.work_frames_after_hello)(self.node_id):
            await self.send_frame(work)

    async def disconnect(self, code):
        self.closed = True
        if self.node_id is not None:
            AGENTS_CONNECTED.dec()
            await self.channel_layer.group_discard(agent_group(self.node_id), self.channel_name)

    async def close_with(self, code):
        self.closed = True
        await self.close(code=code)

    async def receive(self, text_data=None, bytes_data=None):
        if self.closed:
            return
        data = text_data if text_data is not None else bytes_data
        # A str takes 1 to 4 bytes a character in UTF-8: count them only where it matters.
        if isinstance(data, str) and len(data) * 4 <= MAX_FRAME_BYTES:
            size = len(data)
        else:
            size = len(data.encode()) if isinstance(data, str) else len(data)
        if size > MAX_FRAME_BYTES:
            await self.close_with(CLOSE_TOO_BIG)
            return
        frame = fast_sample(data)  # most frames: a sample, read and checked at once
        if frame is None:
            # The bucket first, on a quick read: a flood is refused without being read exactly.
            quick = quick_read(data)
            if quick.kind not in (None, "sample"):
                wait = self.frame_bucket.take()
                if wait:
                    await self.rate_limit(quick.kind, quick.event_id, wait,
                                          "more frames than this server takes from one "
                                          "connection (samples aside)")
                    return
        try:
            if frame is None:
                frame = exact_frame(data)
            kind = "sample" if isinstance(frame, FastSample) else frame["type"]
            if self.node_id is None and kind != "hello":
                raise BadFrame("send hello first", code="hello_required")
        except BadFrame as exc:
            await self.refuse(exc)
            return
        handler = self.on_sample if kind == "sample" else getattr(self, f"on_{kind}")
        try:
            await handler(frame)
        except StopConsumer:
            raise
        except DATABASE_ERRORS as exc:  # PROTOCOL.md: answered, and the connection stays
            logger.warning("agent %s frame of node %s not handled: %s", kind, self.node_id, exc)
            await self.send_server_error(kind, frame)
        except Exception:  # noqa: BLE001 - a bug: answered the same way
            logger.exception("agent %s frame of node %s not handled", kind, self.node_id)
            await self.send_server_error(kind, frame)

    async def refuse(self, exc):
        now = time.monotonic()
        self.bad_frames.append(now)
        while self.bad_frames and self.bad_frames[0] < now - BAD_FRAME_WINDOW_S:
            self.bad_frames.popleft()
        if len(self.bad_frames) > BAD_FRAME_LIMIT:
            await self.close_with(CLOSE_TOO_MANY_BAD_FRAMES)
            return
        error = {"type": "error", "code": exc.code, "message": exc.message}
        if exc.event_id is not None:
            error["id"] = exc.event_id  # the agent drops it: resending can never succeed
        await self.send_frame(error)

    async def send_frame(self, frame):
        await self.send(text_data=json.dumps(frame))

    async def rate_limit(self, kind, event_id, retry_after_s, why):
        """Answer a frame rate_limited (PROTOCOL.md); an event (`event_id`) is sent again
        after retry_after_s. A connection that goes on past it (refusals less than
        RATE_LIMITED_GAP_S apart) for CLUSTERUI_AGENT_RATE_LIMIT_CLOSE_S is closed with 4429."""
        RATE_LIMITED.labels("event" if kind == "event" else "frame").inc()
        now = time.monotonic()
        if self.limited_since is None or now - self.last_limited > RATE_LIMITED_GAP_S:
            self.limited_since = now
        self.last_limited = now
        if now - self.limited_since >= settings.CLUSTERUI_AGENT_RATE_LIMIT_CLOSE_S:
            logger.warning("agent connection of node %s closed: rate limited for %.0f s",
                           self.node_id, now - self.limited_since)
            await self.close_with(CLOSE_RATE_LIMITED)
            return
        error = {"type": "error", "code": "rate_limited",
                 "message": f"{why}: send it again after retry_after_s",
                 "retry_after_s": round(max(retry_after_s, 0.05), 2)}
        if event_id is not None:
            error["retry_id"] = event_id
        await self.send_frame(error)

    async def send_server_error(self, kind, frame):
        """`frame`, of this kind, was not handled (the database or a bug): an event goes again
        later."""
        error = {"type": "error", "code": "server_error",
                 "message": f"the {kind} was not handled; send it again later"}
        if kind == "event":
            error["retry_id"] = frame["id"]
        await self.send_frame(error)

    async def on_hello(self, frame):
        if not HELLOS.admit():
            await self.refuse_hello(HELLOS)
            return
        try:
            await self.welcome(frame)
        finally:
            HELLOS.done()

    async def refuse_hello(self, admission):
        RATE_LIMITED.labels("hello").inc()
        await self.send_frame({"type": "error", "code": "rate_limited",
                               "message": "the server has many hellos in hand; say hello "
                                          "again after retry_after_s",
                               "retry_after_s": admission.retry_after()})

    async def welcome(self, frame):
        if self.grant is TOKEN_NOT_CHECKED:
            self.grant = await on_agent_threads(reconnects.authenticate)(self.token)
            if self.grant is None:
                await self.close_with(CLOSE_BAD_TOKEN)
                return
        if self.grant.node_id is not None and frame["node"] == self.grant.node_name:
            # In the node's group before its hello reads what is owed: work queued from now
            # on is offered to this connection (after the welcome: one message at a time).
            await self.join_node_group(self.grant.node_id, frame)
            known = await on_agent_threads(reconnects.welcome_known_node)(self.grant, frame)
            if known is not None:
                self.start_serving(known.node_id, known.cluster_id, frame)
                await self.send_welcome(None)
                await self.send_frame(known.config)
                return
        if not FULL_HELLOS.admit():
            await self.refuse_hello(FULL_HELLOS)
            return
        try:
            await self.full_hello(frame)
        finally:
            FULL_HELLOS.done()

    async def full_hello(self, frame):
        """A join, or a hello that changes its node (gateway.ingest.accept_hello)."""
        outcome = await on_full_hello_threads(ingest.accept_hello)(self.grant, frame)
        if outcome.close_code is not None:
            logger.info("agent hello refused (%s): %s", outcome.close_code, outcome.reason)
            await self.close_with(outcome.close_code)
            return
        await self.join_node_group(outcome.node_id, frame)
        if outcome.grant is not None:  # joined: the connection is the new node token's now
            self.grant = outcome.grant
        self.start_serving(outcome.node_id, outcome.cluster_id, frame)
        await self.send_welcome(outcome.node_token)
        for after_welcome in await on_full_hello_threads(ingest.frames_after_welcome)(
                self.node_id):
            await self.send_frame(after_welcome)

    async def join_node_group(self, node_id, frame):
        """This connection becomes its node's: an older one goes (4409)."""
        if self.node_id not in (None, node_id):
            await self.channel_layer.group_discard(agent_group(self.node_id), self.channel_name)
        group = agent_group(node_id)
        try:
            await self.channel_layer.group_send(group, {"type": "agent.replaced",
                                                        "by": self.channel_name})
            await self.channel_layer.group_add(group, self.channel_name)
        except LAYER_ERRORS as exc:
            # The reader of the layer fails too, and joins the group once Redis is back.
            logger.warning("channel layer unreachable at %s's hello (%s)", frame["node"], exc)

    def start_serving(self, node_id, cluster_id, frame):
        if self.node_id is None:
            AGENTS_CONNECTED.inc()
        self.node_id, self.cluster_id = node_id, cluster_id
        self.memory_totals = {gpu["uuid"]: gpu.get("memory_total_bytes") for gpu in frame["gpus"]}

    async def send_welcome(self, node_token):
        welcome = {"type": "welcome", "node_id": self.node_id,
                   "sample_interval_s": ingest.sample_interval_s()}
        if node_token is not None:
            welcome["node_token"] = node_token
        await self.send_frame(welcome)

    async def agent_access(self, message):
        """The node's token was revoked or the node removed (the change feed): if this
        connection's token no longer works, it goes (PROTOCOL.md, 4401)."""
        if self.closed or self.grant in (None, TOKEN_NOT_CHECKED):
            return
        if not await on_agent_threads(ingest.grant_usable)(self.grant):
            logger.info("agent connection of node %s closed: its token was revoked or the "
                        "node removed", self.node_id)
            await self.close_with(CLOSE_BAD_TOKEN)

    async def agent_replaced(self, message):
        """A newer connection for this node said hello: this one goes (PROTOCOL.md, 4409)."""
        if message["by"] != self.channel_name and not self.closed:
            await self.close_with(CLOSE_REPLACED)

    async def on_sample(self, frame):
        """A FastSample, or an exact_frame() sample (one with hygiene, or with fields this
        server does not know)."""
        if not isinstance(frame, FastSample):
            if frame.get("hygiene") is not None:
                self.hygiene = known_hygiene(frame["hygiene"])
            frame = as_fast_sample(frame)
        unknown = [gpu.uuid for gpu in frame.gpus if gpu.uuid not in self.memory_totals]
        if unknown:
            frame.gpus = [gpu for gpu in frame.gpus if gpu.uuid in self.memory_totals]
            await self.send_frame({
                "type": "error", "code": "bad_message",
                "message": f"sample.gpus: not in this connection's hello, dropped: "
                           f"{', '.join(unknown)}",
            })
        self.live_store.record(self.cluster_id, live_sample(
            frame, node_id=self.node_id, received_at=time.time(), memory_totals=self.memory_totals,
            hygiene=self.hygiene))

    async def on_event(self, frame):
        """Handed to the batch writer; the answer goes when its batch is stored, and the
        connection reads on meanwhile."""
        if len(self.events_in_flight) >= EVENTS_IN_FLIGHT:
            await self.rate_limit("event", frame["id"], 1.0, f"{EVENTS_IN_FLIGHT} of this "
                                                             f"connection's events are being "
                                                             f"stored")
            return
        wait = NEW_EVENTS.take(self.node_id, settings.CLUSTERUI_AGENT_NEW_EVENTS_PER_HOUR)
        counted = not wait
        if wait and not await on_agent_threads(ingest.event_received)(frame["id"]):
            await self.rate_limit("event", frame["id"], wait,
                                  f"node {self.node_id} sent "
                                  f"{settings.CLUSTERUI_AGENT_NEW_EVENTS_PER_HOUR} new events "
                                  f"this hour")
            return  # (a resend of one stored before is acked again, over the cap or not)
        task = asyncio.ensure_future(self.store_and_answer(self.node_id, frame, counted,
                                                           time.monotonic()))
        self.events_in_flight.add(task)
        task.add_done_callback(self.events_in_flight.discard)

    async def store_and_answer(self, node_id, frame, counted, received):
        outcome = await event_writer().store(node_id, frame)
        if counted and outcome is not ingest.EventOutcome.STORED:
            NEW_EVENTS.give_back(node_id)  # a resend, or not stored: not a new event
        if self.closed:
            return  # not acked: the agent sends it again, and it is acked then
        if outcome is ingest.EventOutcome.FAILED:
            await self.send_server_error("event", frame)
        elif outcome is ingest.EventOutcome.OPEN_EVENTS_FULL:
            await self.rate_limit("event", frame["id"], 60.0,
                                  f"node {node_id} has "
                                  f"{settings.CLUSTERUI_AGENT_OPEN_EVENTS_MAX} open events")
        else:
            await self.send_frame({"type": "ack", "ids": [frame["id"]]})
            EVENT_ACK_SECONDS.observe(time.monotonic() - received)

    async def on_check_result(self, frame):
        if not await on_agent_threads(ingest.record_check_result)(self.node_id, frame):
            await self.send_frame({
                "type": "error", "code": "bad_message",
                "message": f"check_result.run_id: no run {frame['run_id']} for this node",
            })

    async def work_offer(self, message):
        """Work was queued for this node's agent (nodes.agent_work, offered by the publisher
        from the change feed)."""
        if self.node_id is None or self.closed:
            return
        frames = await on_agent_threads(ingest.work_frames)(
            self.node_id, message["kind"], [message["id"]])
        for frame in frames:
            await self.send_frame(frame)

    async def on_command_result(self, frame):
        if not await on_agent_threads(ingest.record_command_result)(self.node_id, frame):
            await self.send_frame({
                "type": "error", "code": "bad_message",
                "message": f"command_result.id: no command {frame['id']} for this node",
            })

    async def on_script_result(self, frame):
        await on_agent_threads(ingest.record_script_result)(self.node_id, frame)

    async def config_changed(self, message):
        """An admin saved a startup script or changed the node's role (an AGENT_CONFIG change,
        offered by the publisher)."""
        if self.node_id is None or self.closed:
            return
        await self.send_frame(await on_agent_threads(ingest.config_frame)(self.node_id))
