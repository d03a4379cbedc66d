"""The agent's WebSocket client (shared/PROTOCOL.md).

Two loops run side by side:

- the collector reads the backend and the node every sample interval, whether or not
  the server is reachable: new events go into the outbox at once (and out, when
  connected), samples go out only while connected (they are fire-and-forget);
- the connection loop connects, sends `hello`, waits for `welcome`, resends every event
  still in the outbox, then handles the server's frames until the connection ends, and
  reconnects after a backoff with full jitter (1 s doubling up to 30 s, back to the
  start after a connection that lasted).

Checks (`run_check`) and commands (`command`) run in tasks of their own beside them, and
so do the boot startup scripts (agent/work/scripts.py), once per boot, when the first `config`
after the agent starts brings them. Script results wait in the state dir (ResultSpool) until
sent; the Slurm hook (agent/hook.py) leaves its results there too.
"""

import asyncio
import collections
import json
import logging
import math
import random
import time
from urllib.parse import urlsplit

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from agent import __version__
from agent.compat import timeout
from agent.config import MAX_SAMPLE_INTERVAL_S, MIN_SAMPLE_INTERVAL_S
from agent.connection import protocol
from agent.connection.node_token import save_node_token
from agent.work import scripts
from agent.work.commands import CommandFailed

log = logging.getLogger(__name__)

BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 30.0
STABLE_CONNECTION_S = 60.0  # a connection that lasted this long resets the backoff
WELCOME_TIMEOUT_S = 30.0
# An event the server could not store (`error` with retry_id) goes again after the
# retry_after_s it names, kept within these bounds, or after the default.
RETRY_AFTER_DEFAULT_S = 5.0
RETRY_AFTER_MIN_S = 0.1
RETRY_AFTER_MAX_S = 300.0
RECEIVE_MAX_BYTES = 16 * 1024 * 1024  # a config frame carries startup script bodies
# After a reconnect the outbox goes out at this pace (a burst, then so many a second): under
# the server's rate limit (PROTOCOL.md: 20 a second, bursts of 200), with room left for the
# node's new events.
RESEND_BURST = 100
RESEND_PER_S = 10.0
RECENT_EVENTS_MAX = 2000  # kept for a diagnostic bundle's last hour of events
HYGIENE_RESEND_S = 60.0  # a sample carries unchanged hygiene readings at least this often


def backoff_ceiling(attempt, base_s=BACKOFF_BASE_S, cap_s=BACKOFF_CAP_S):
    """The longest wait before reconnect attempt number `attempt` (0, 1, 2, ...):
    base, 2 x base, 4 x base, ... never above the cap."""
    return min(cap_s, base_s * 2 ** min(attempt, 32))


def backoff_delay(attempt, rng=random, base_s=BACKOFF_BASE_S, cap_s=BACKOFF_CAP_S):
    """Full jitter: anywhere from 0 to the ceiling, so a fleet that lost the server at
    the same moment does not come back at the same moment."""
    return rng.uniform(0, backoff_ceiling(attempt, base_s, cap_s))


def retry_after(error):
    """How long to wait before sending again what `error` answered: its retry_after_s,
    kept within bounds, or RETRY_AFTER_DEFAULT_S."""
    delay = error.get("retry_after_s")
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not math.isfinite(delay):
        return RETRY_AFTER_DEFAULT_S
    return min(max(float(delay), RETRY_AFTER_MIN_S), RETRY_AFTER_MAX_S)


class AgentClient:
    """One node's connection to the server. config: agent.config.Config (server, token,
    state_dir, sample_interval_s); node: agent.node.Node, started (what the client reads
    and drives); outbox: the node's events until acked (agent.connection.outbox.Outbox);
    node_token: the stored node token, or None; tls: an ssl.SSLContext for wss://
    (agent.config.tls_context), None for ws://. The rest are for tests."""

    def __init__(
        self,
        config,
        node,
        *,
        outbox,
        node_token=None,
        tls=None,
        backoff_base_s=BACKOFF_BASE_S,
        backoff_cap_s=BACKOFF_CAP_S,
        stable_connection_s=STABLE_CONNECTION_S,
        rng=random,
    ):
        self.server_url = config.server
        self._tls = tls
        self.node_name = node.name
        self.boot_id = node.boot_id
        self.sample_interval_s = config.sample_interval_s
        self.startup_scripts = []  # from `config`, saved in the state dir for the hook
        self._join_token = config.token
        self._node_token = node_token
        self._node_token_refused = False
        self._state_dir = config.state_dir
        self._backend = node.backend
        self._node_metrics = node.node_metrics
        self._outbox = outbox
        self._watchers = list(node.watchers)
        self._check_runner = node.check_runner
        self._read_slurm = node.read_slurm  # the hello's `slurm`
        self._check_tasks = {}  # run_id -> the task running it
        # check_result and command_result frames that came while disconnected
        self._unsent_results = []
        self._command_handler = node.command_handler
        # Node hygiene's readings (agent.hygiene.Hygiene.status): a callable, or None.
        self._hygiene_status = node.hygiene_status
        self._hygiene_sent = None  # (readings less their times, when sent) on this connection
        self._command_tasks = {}  # command id -> the task carrying it out
        self._command_answers = {}  # command id -> the latest command_result sent for it
        self._back_at = None  # reboot_into(): time.monotonic() when the node is up again
        self._backoff_base_s = backoff_base_s
        self._backoff_cap_s = backoff_cap_s
        self._stable_connection_s = stable_connection_s
        self._rng = rng
        self._ws = None  # the connection, once welcomed; None while there is none
        self._seq = 0  # the next sample's seq on this connection
        self._welcomed_at = None
        self._resend_tasks = set()  # events the server asked for again (retry_id)
        self._interval_changed = asyncio.Event()
        self._spool = scripts.ResultSpool(config.state_dir)
        self._spool_lock = asyncio.Lock()
        self._boot_task = None  # the node_boot scripts, while they run
        # (time.time(), event frame) of the events raised lately, for a diagnostic bundle
        self._recent_events = collections.deque(maxlen=RECENT_EVENTS_MAX)

    async def run(self):
        """Run until cancelled."""
        collector = asyncio.create_task(self._collect_forever(), name="collector")
        try:
            await self._connect_forever()
        finally:
            tasks = [collector, *self._check_tasks.values(), *self._command_tasks.values()]
            if self._boot_task is not None:
                tasks.append(self._boot_task)
            for task in tasks:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass

    # The collector

    async def _collect_forever(self):
        next_tick = time.monotonic()
        while True:
            try:
                await self.collect_once()
                await self.send_script_results()  # the Slurm hook's, as they come
            except Exception:
                log.exception("collecting a sample failed")
            next_tick += self.sample_interval_s
            now = time.monotonic()
            if next_tick < now:  # fell behind (a slow send): carry on from now
                next_tick = now
            try:
                async with timeout(next_tick - now):
                    await self._interval_changed.wait()
            except asyncio.TimeoutError:
                continue
            # The server set a new interval: start it now, not at the end of the old one.
            self._interval_changed.clear()
            next_tick = time.monotonic()

    async def collect_once(self):
        """Read everything once: events to the outbox (and out), a sample out."""
        gpus = self._backend.read_gpus()
        node = self._node_metrics.read()
        events = self._backend.take_events()
        for watcher in self._watchers:
            events.extend(watcher.poll(gpus))
        for event in events:
            await self.emit(event)
        ws = self._ws
        if ws is not None:
            frame = protocol.sample_frame(seq=self._seq, gpus=gpus, node=node)
            hygiene = self._hygiene_due()
            if hygiene is not None:
                frame["hygiene"] = hygiene
            self._seq += 1
            await self._send(ws, frame)

    def _hygiene_due(self):
        """Node hygiene's readings, when a sample should carry them: the first on a
        connection, when they changed (times aside), and at least every minute."""
        if self._hygiene_status is None:
            return None
        hygiene = self._hygiene_status()
        if not hygiene:
            return None
        unchanging = {part: {key: value for key, value in readings.items()
                             if key != "checked_at"} for part, readings in hygiene.items()}
        now = time.monotonic()
        if (self._hygiene_sent is not None and self._hygiene_sent[0] == unchanging
                and now - self._hygiene_sent[1] < HYGIENE_RESEND_S):
            return None
        self._hygiene_sent = (unchanging, now)
        return hygiene

    async def emit(self, event):
        """Keep an event in the outbox until acked, and send it now if connected."""
        try:
            protocol.encode(event)
        except protocol.FrameError as exc:
            log.error("event %s cannot be sent, dropped: %s", event.get("signature"), exc)
            return
        dropped = self._outbox.add(event)
        self._recent_events.append((time.time(), event))
        if dropped:
            log.warning("the outbox is full (%d MB): %d older events dropped to make room "
                        "(the next hello tells the server)",
                        self._outbox.max_bytes // 2**20, dropped)
        log.info("event %s %s on %s", event["signature"], event["state"], event["gpu_uuid"])
        ws = self._ws
        if ws is not None:
            await self._send(ws, event)

    # What a diagnostic bundle (agent/work/bundles.py) takes from the client.

    def nvml_readings(self):
        """The GPUs' readings now, as a sample carries them."""
        return self._backend.read_gpus()

    def events_since(self, seconds):
        """The event frames raised in the last `seconds`, oldest first."""
        cutoff = time.time() - seconds
        return [event for at, event in self._recent_events if at >= cutoff]

    def upload_target(self):
        """(the server's origin, "http(s)://host:port", this node's token, the TLS context)
        for the agent's HTTP endpoints (PROTOCOL.md: the same host as the WebSocket)."""
        parts = urlsplit(self.server_url)
        scheme = "https" if parts.scheme == "wss" else "http"
        token, _ = self._token()
        return f"{scheme}://{parts.netloc}", token, self._tls

    async def _send(self, ws, frame):
        try:
            text = protocol.encode(frame)
        except protocol.FrameError as exc:
            log.error("not sent: %s", exc)
            return
        try:
            await ws.send(text)
        except ConnectionClosed:
            pass  # the connection loop sees it end and reconnects

    # The connection

    async def _connect_forever(self):
        attempt = 0
        while True:
            if self._back_at is not None:  # reboot_into(): down for the boot, then at once
                await asyncio.sleep(max(0.0, self._back_at - time.monotonic()))
                self._back_at = None
                attempt = 0
            self._welcomed_at = None
            await self._connect_once()
            if self._back_at is not None:
                continue
            if (
                self._welcomed_at is not None
                and time.monotonic() - self._welcomed_at >= self._stable_connection_s
            ):
                attempt = 0
            delay = backoff_delay(attempt, self._rng, self._backoff_base_s, self._backoff_cap_s)
            attempt += 1
            log.info("reconnecting in %.1f s", delay)
            await asyncio.sleep(delay)

    def _token(self):
        """(token, "node" or "join"): the stored node token wins over the join token,
        unless the server refused it and there is a join token to fall back on."""
        if self._node_token and not (self._node_token_refused and self._join_token):
            return self._node_token, "node"
        return self._join_token, "join"

    async def _connect_once(self):
        """One connection, from connect to close. Logs why it ended; never raises
        (except when cancelled)."""
        token, kind = self._token()
        headers = {"Authorization": f"Bearer {token}"}
        try:
            async with connect(
                self.server_url,
                additional_headers=headers,
                user_agent_header=f"clusterui-agent/{__version__}",
                max_size=RECEIVE_MAX_BYTES,
                close_timeout=5,
                **({"ssl": self._tls} if self._tls is not None else {}),
            ) as ws:
                try:
                    await self._serve(ws)
                except asyncio.CancelledError:  # the agent is stopping
                    await ws.close(1001, "agent stopping")
                    raise
            self._log_close(ws.close_code, ws.close_reason, kind)
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status in (401, 403):
                self._token_refused(kind, f"HTTP {status} at the handshake")
            else:
                log.error("the server refused the WebSocket handshake: HTTP %d", status)
        except (OSError, WebSocketException) as exc:
            log.warning("cannot connect to %s: %s", self.server_url, str(exc) or type(exc).__name__)

    async def _serve(self, ws):
        """hello, welcome, resend the outbox, then answer the server until it closes."""
        resending = None
        try:
            gpus = await self._handshake(ws)
            if gpus is None:
                return
            pending = self._go_live(ws, gpus)
            resending = asyncio.ensure_future(self._resend_paced(ws, pending))
            results, self._unsent_results = self._unsent_results, []
            for result in results:
                await self._send(ws, result)
            await self.send_script_results()

            async for message in ws:
                frame = _parse(message)
                if frame is not None:
                    await self._handle(ws, frame)
        except ConnectionClosed:
            pass
        finally:
            self._ws = None
            if resending is not None:
                resending.cancel()

    async def _handshake(self, ws):
        """Say hello (again, while the server cannot take it) until the welcome; the hello's
        GPUs, or None when no welcome came in time (logged). Raises ConnectionClosed."""
        gpus = self._backend.gpus()
        slurm = await asyncio.to_thread(self._read_slurm, self.node_name)
        dropped = self._outbox.dropped()
        hello = protocol.hello_frame(
            node=self.node_name,
            boot_id=self.boot_id,
            agent_version=__version__,
            driver_version=self._backend.driver_version,
            cuda_version=self._backend.cuda_version,
            gpus=gpus,
            slurm=slurm,
            outbox_dropped=dropped,
        )
        await ws.send(protocol.encode(hello))
        try:
            async with timeout(WELCOME_TIMEOUT_S) as welcome_due:
                while True:
                    frame = _parse(await ws.recv())
                    if frame is None:
                        continue
                    if frame["type"] == "error" and frame.get("code") in (
                            "server_error", "rate_limited"):
                        # The server could not take the hello now (its database is
                        # away, it has many in hand): say it again on this connection.
                        delay = retry_after(frame)
                        log.warning("the server could not take the hello (%s: %s); again "
                                    "in %.1f s", frame["code"], frame.get("message"), delay)
                        await asyncio.sleep(delay)
                        await ws.send(protocol.encode(hello))
                        welcome_due.reschedule(
                            asyncio.get_running_loop().time() + WELCOME_TIMEOUT_S)
                        continue
                    await self._handle(ws, frame)
                    if frame["type"] == "welcome":
                        break
        except asyncio.TimeoutError:
            log.error("the server sent no welcome within %.0f s", WELCOME_TIMEOUT_S)
            return None
        if dropped:
            self._outbox.told(dropped)
        return gpus

    def _go_live(self, ws, gpus):
        """Take the outbox and go live with no await in between: an event added from here
        on is sent by emit(), one added before is in the list returned (to resend)."""
        pending = self._outbox.pending()
        self._seq = 0
        self._hygiene_sent = None  # the first sample on a connection carries it
        self._ws = ws
        self._welcomed_at = time.monotonic()
        log.info(
            "connected to %s as %s with %d GPUs; resending %d unacked events",
            self.server_url,
            self.node_name,
            len(gpus),
            len(pending),
        )
        return pending

    async def _resend_paced(self, ws, pending):
        """The outbox as it was at the welcome, oldest first: RESEND_BURST at once, then
        RESEND_PER_S; an event acked meanwhile (a resend answered) is skipped."""
        for number, event in enumerate(pending):
            if number >= RESEND_BURST:
                await asyncio.sleep(1 / RESEND_PER_S)
            if self._outbox.get(event["id"]) is not None:
                await self._send(ws, event)

    def _log_close(self, code, reason, kind):
        why = f"close {code}" + (f" {reason!r}" if reason else "")
        if code == 4401:
            self._token_refused(kind, why)
        elif code == 4403:
            log.error(
                "the server refused node %s (%s): its node token names another node, or a "
                "join token named a node that exists and is not open to re-join (an admin "
                "opens it on the node's page)",
                self.node_name,
                why,
            )
        elif code == 4429:
            log.error("the server closed the connection: rate limited for too long (%s)", why)
        elif code == 4409:
            log.warning(
                "replaced by a newer connection for node %s (%s): is another agent "
                "running with the same node name?",
                self.node_name,
                why,
            )
        elif code == 4400:
            log.error("the server closed the connection after too many bad frames (%s)", why)
        elif code == 1009:
            log.error("the server closed the connection: a frame was too large (%s)", why)
        else:
            log.warning("connection to %s ended (%s)", self.server_url, why)

    def _token_refused(self, kind, why):
        if kind == "node" and self._join_token and not self._node_token_refused:
            self._node_token_refused = True
            log.error("the server refused the stored node token (%s); trying the join token", why)
        elif kind == "node":
            log.error(
                "the server refused the stored node token (%s) and there is no join token "
                "to fall back on; retrying with backoff (give a join token with --token-file)",
                why,
            )
        else:
            log.error(
                "the server refused the join token (%s): unknown, expired or revoked; "
                "retrying with backoff until an admin fixes it",
                why,
            )

    # Frames from the server

    async def _handle(self, ws, frame):
        kind = frame["type"]
        if kind == "welcome":
            self._on_welcome(frame)
        elif kind == "ack":
            ids = frame.get("ids")
            if isinstance(ids, list):
                self._outbox.remove([i for i in ids if isinstance(i, str)])
        elif kind == "config":
            self._apply_sample_interval(frame.get("sample_interval_s"))
            if isinstance(frame.get("startup_scripts"), list):
                self._take_startup_scripts(frame["startup_scripts"])
        elif kind == "error":
            self._on_error(frame)
        elif kind == "command":
            await self._on_command(ws, frame)
        elif kind == "run_check":
            await self._start_check(ws, frame)
        else:
            log.warning("ignoring a frame of unknown type %r", kind)

    def _take_startup_scripts(self, entries):
        """Keep the config's scripts (in the state dir too, for the Slurm hook), and start the
        node_boot ones if they have not run since this boot."""
        self.startup_scripts = scripts.valid_scripts(entries)
        log.info("received %d startup scripts", len(self.startup_scripts))
        try:
            scripts.save_scripts(self._state_dir, self.startup_scripts)
        except OSError as exc:
            log.error("cannot save the startup scripts in %s for the Slurm hook: %s",
                      self._state_dir, exc.strerror or exc)
        if self._boot_task is not None:
            return
        if scripts.boot_scripts_ran_for(self._state_dir) == self.boot_id:
            return
        boot = [s for s in self.startup_scripts if s["event"] == "node_boot"]
        self._boot_task = asyncio.create_task(self._run_boot_scripts(self.boot_id, boot),
                                              name="boot-scripts")

    async def _run_boot_scripts(self, boot_id, boot):
        """Each node_boot script in turn, with its time limit; each result to the spool and
        out. The boot id is marked done after the last, so a restart mid-way runs them again."""
        try:
            for script in boot:
                log.info("running boot script %s (version %s)", script["id"],
                         script.get("version"))
                result = await asyncio.to_thread(scripts.run_script, script)
                log.info("boot script %s: exit %s%s in %.1f s", script["id"],
                         result["exit_code"], " (timed out)" if result["timed_out"] else "",
                         result["duration_s"])
                self._spool.add(result)
                await self.send_script_results()
            scripts.mark_boot_scripts_ran(self._state_dir, boot_id)
        except asyncio.CancelledError:
            raise
        except Exception:  # a failure here must not end the agent
            log.exception("running the boot scripts failed")
        finally:
            self._boot_task = None

    async def send_script_results(self):
        """Send the spooled script results while connected; each file goes once sent. An
        event the hook spooled (a job's cleanup) moves to the outbox, sent like any other."""
        async with self._spool_lock:
            for path, frame in self._spool.pending():
                if frame.get("type") == "event":
                    await self.emit(frame)
                    self._spool.remove(path)
            ws = self._ws
            if ws is None:
                return
            for path, frame in self._spool.pending():
                try:
                    text = protocol.encode(frame)
                except protocol.FrameError as exc:
                    log.error("dropping a script result that cannot be sent: %s", exc)
                    self._spool.remove(path)
                    continue
                try:
                    await ws.send(text)
                except ConnectionClosed:
                    return  # sent after the next welcome
                self._spool.remove(path)

    def _spawn(self, coroutine):
        task = asyncio.get_running_loop().create_task(coroutine)
        self._resend_tasks.add(task)
        task.add_done_callback(self._resend_tasks.discard)

    async def _resend(self, event_id):
        """Send an event of the outbox again, if it is still there and a connection is up
        (otherwise the next connection resends it with the rest)."""
        event, ws = self._outbox.get(event_id), self._ws
        if event is not None and ws is not None:
            await self._send(ws, event)

    def _on_welcome(self, frame):
        node_token = frame.get("node_token")  # present only after a join
        if isinstance(node_token, str) and node_token:
            if node_token != self._node_token:
                save_node_token(self._state_dir, node_token)
                self._node_token = node_token
                log.info("stored the node token issued by the server")
            self._node_token_refused = False
        self._apply_sample_interval(frame.get("sample_interval_s"))

    def _apply_sample_interval(self, value):
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            log.warning("ignoring sample_interval_s %r from the server: not a number", value)
        elif not MIN_SAMPLE_INTERVAL_S <= value <= MAX_SAMPLE_INTERVAL_S:
            log.warning("ignoring sample_interval_s %r from the server: out of range", value)
        elif value != self.sample_interval_s:
            log.info("sample interval %g s (set by the server)", value)
            self.sample_interval_s = float(value)
            self._interval_changed.set()

    def _on_error(self, frame):
        log.warning("server error %s: %s", frame.get("code"), frame.get("message"))
        retry_id = frame.get("retry_id")
        if isinstance(retry_id, str) and self._outbox.get(retry_id) is not None:
            # Not stored (the server's database was away, a rate limit): the event stays
            # in the outbox and goes again after retry_after_s (PROTOCOL.md).
            delay = retry_after(frame)
            log.info("the server asks for event %s again in %.1f s", retry_id, delay)
            asyncio.get_running_loop().call_later(
                delay, lambda: self._spawn(self._resend(retry_id)))
        event_id = frame.get("id")
        if isinstance(event_id, str):
            event = self._outbox.get(event_id)
            if self._outbox.remove([event_id]):
                log.error(
                    "the server refused event %s (%s); dropped from the outbox, since "
                    "resending it can never succeed",
                    event_id,
                    event.get("signature") if event else "?",
                )

    async def _on_command(self, ws, frame):
        """`failed` for an action this agent does not carry out; else `accepted` at once, and
        the command handler carries it out in the background (`failed` if it cannot). An id
        already handled gets its latest answer again and nothing is done twice: the server
        sends a command again when the answer did not reach it."""
        command_id = frame.get("id")
        action = frame.get("action")
        params = frame.get("params")
        if isinstance(command_id, bool) or not isinstance(command_id, int):
            log.warning("ignoring a command without an integer id: %.200r", frame)
            return
        if command_id in self._command_answers:
            log.info("command %s (%s) was handled already; answered as before", command_id,
                     action)
            await self._send(ws, self._command_answers[command_id])
            return
        handler = self._command_handler
        if handler is None or action not in handler.actions:
            log.warning("command %s: action %r is not supported", command_id, action)
            await self._send(ws, self._command_result(
                command_id, "failed", f"action {action} is not supported by this agent version"))
            return
        log.info("command %s: %s accepted", command_id, action)
        await self._send(ws, self._command_result(command_id, "accepted"))
        if not isinstance(params, dict):
            params = {}
        self._command_tasks[command_id] = asyncio.create_task(
            self._run_command(command_id, action, params), name=f"command-{command_id}")

    async def _run_command(self, command_id, action, params):
        status = "failed"
        try:
            message = await self._command_handler.run(action, params, self)
            if message is None:
                return  # a reboot: the server sees it done at the next hello
            status = "ok"
        except asyncio.CancelledError:
            raise
        except CommandFailed as exc:
            message = str(exc)
        except Exception as exc:  # a bug in a handler must not end the agent
            log.exception("command %s (%s) failed to run", command_id, action)
            message = f"the agent failed to run it: {exc}"
        finally:
            self._command_tasks.pop(command_id, None)
        if status == "ok":
            log.info("command %s (%s) done: %s", command_id, action, message)
        else:
            log.error("command %s (%s) failed: %s", command_id, action, message)
        frame = self._command_result(command_id, status, message)
        ws = self._ws
        if ws is None:
            self._unsent_results.append(frame)
        else:
            await self._send(ws, frame)

    def _command_result(self, command_id, status, message=""):
        frame = protocol.command_result_frame(command_id=command_id, status=status,
                                              message=message)
        self._command_answers[command_id] = frame
        return frame

    async def reboot_into(self, boot_id, down_s):
        """A reboot the agent itself plays (agent/sim/boot.py): the connection closes as a
        rebooting node's does, the checks running die with the node, and `down_s` later
        the agent says hello again with `boot_id`."""
        self.boot_id = boot_id
        self._back_at = time.monotonic() + down_s
        for task in list(self._check_tasks.values()):
            task.cancel()
        ws = self._ws
        if ws is not None:
            await ws.close(1001, "rebooting")

    async def _start_check(self, ws, frame):
        """Start a requested check in the background; its check_result goes out when it
        ends (after the next welcome, if the connection dropped meanwhile). A run_id that
        is already running is not started twice (the server resends unanswered runs)."""
        run_id = frame.get("run_id")
        check = frame.get("check")
        params = frame.get("params")
        if isinstance(run_id, bool) or not isinstance(run_id, int):
            log.warning("ignoring a run_check without an integer run_id: %.200r", frame)
            return
        if run_id in self._check_tasks:
            log.info("check run %s is already running", run_id)
            return
        if self._check_runner is None:
            await self._send(ws, protocol.check_result_frame(
                run_id=run_id, status="error",
                message=f"check {check} is not available: this agent runs no checks"))
            return
        if not isinstance(params, dict):
            params = {}
        task = asyncio.create_task(self._run_check(run_id, check, params), name=f"check-{run_id}")
        self._check_tasks[run_id] = task

    async def _run_check(self, run_id, check, params):
        try:
            result = await self._check_runner.run(check, params)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug in a check must not end the agent
            log.exception("check %s (run %s) failed to run", check, run_id)
            result = {"status": "error", "message": f"the agent failed to run it: {exc}"}
        finally:
            self._check_tasks.pop(run_id, None)
        frame = protocol.check_result_frame(run_id=run_id, **result)
        log.info("check %s (run %s): %s %s", check, run_id, frame["status"], frame["message"])
        ws = self._ws
        if ws is None:
            self._unsent_results.append(frame)
        else:
            await self._send(ws, frame)


def _parse(message):
    """A server frame as a dict with a string `type`, or None (logged) if it is not one."""
    if isinstance(message, bytes):
        log.warning("ignoring a binary frame from the server")
        return None
    try:
        frame = json.loads(message)
    except ValueError:
        log.warning("ignoring a frame that is not JSON: %.80r", message)
        return None
    if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
        log.warning("ignoring a frame without a string type: %.80r", message)
        return None
    return frame
