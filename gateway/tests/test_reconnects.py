"""A known node's reconnect (gateway.reconnects): its statements are counted, and every hello
that changes its node still takes the full path (WebsocketCommunicator, InMemoryChannelLayer)."""

import asyncio
import threading
from contextlib import contextmanager
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from channels.testing import HttpCommunicator
from django.db.backends.utils import CursorWrapper
from django.utils import timezone

from clusterui.asgi import application
from common.groups import agent_group
from gateway import ingest
from healthchecks.models import CheckRun, HealthEvent
from healthchecks.services import do_request_check
from nodes.models import AgentToken, Node, NodeTransition
from nodes.services import do_revoke_agent_token, do_send_command
from startup.services import Validation, do_save_startup_script
from gateway.tests.test_consumers import (
    GPUS,
    closed_with,
    connect,
    event,
    hello,
    join,
    receive,
    send,
)

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("in_memory_channel_layer")]


class Statements:
    """Every statement Django sends, on every connection of every thread."""

    def __init__(self):
        self.sql, self.lock = [], threading.Lock()

    def note(self, sql):
        with self.lock:
            self.sql.append(" ".join(sql.split())[:90])


@contextmanager
def counted_statements(monkeypatch):
    statements = Statements()
    execute, executemany = CursorWrapper._execute, CursorWrapper._executemany

    def counted_execute(self, sql, params, *ignored):
        statements.note(sql)
        return execute(self, sql, params, *ignored)

    def counted_executemany(self, sql, param_list, *ignored):
        statements.note(sql)
        return executemany(self, sql, param_list, *ignored)

    monkeypatch.setattr(CursorWrapper, "_execute", counted_execute)
    monkeypatch.setattr(CursorWrapper, "_executemany", counted_executemany)
    yield statements


async def joined(join_token):
    """The node token of a node that joined and said hello once."""
    communicator, welcome = await join(join_token)
    await communicator.disconnect()
    return welcome["node_token"]


async def say_hello(token, **fields):
    """Connect and say hello; (the communicator, the frames up to and with config)."""
    communicator = await connect(token)
    await send(communicator, hello(**fields))
    frames = [await receive(communicator)]
    assert frames[0]["type"] == "welcome", frames
    while frames[-1]["type"] != "config":
        frames.append(await receive(communicator))
    return communicator, frames


async def test_a_known_nodes_reconnect_is_three_statements(join_token, monkeypatch):
    """The token check at connect, then one UPDATE and one read of its config. Fails when
    the count grows: a reconnect storm is 4,000 of these (bench/reconnect)."""
    node_token = await joined(join_token)
    with counted_statements(monkeypatch) as statements:
        communicator, frames = await say_hello(node_token)
        await communicator.disconnect()
    assert [frame["type"] for frame in frames] == ["welcome", "config"]
    assert len(statements.sql) == 3, statements.sql
    select_token, update_node, read_config = statements.sql
    assert select_token.startswith("SELECT") and "agenttoken" in select_token
    assert update_node.startswith("UPDATE") and "nodes_node" in update_node
    assert read_config.startswith("SELECT") and "startupscript" in read_config


async def test_the_known_hello_notes_the_hello_and_changes_nothing_else(join_token):
    node_token = await joined(join_token)
    before = await database_sync_to_async(Node.objects.get)(name="gpu-001")
    transitions = await database_sync_to_async(NodeTransition.objects.count)()
    communicator, frames = await say_hello(node_token)
    await communicator.disconnect()
    after = await database_sync_to_async(Node.objects.get)(name="gpu-001")
    assert frames[0]["node_id"] == after.pk and "node_token" not in frames[0]
    assert after.last_hello_at > before.last_hello_at and after.last_seen > before.last_seen
    assert (after.state, after.booted_at, after.boot_id) == (before.state, before.booted_at,
                                                             before.boot_id)
    assert await database_sync_to_async(NodeTransition.objects.count)() == transitions


async def test_a_secret_named_by_a_startup_script_is_one_read_more(join_token, cluster, admin,
                                                                   monkeypatch):
    node_token = await joined(join_token)
    from clusters.secret_store import do_set_secret

    await database_sync_to_async(do_set_secret)("BMC_PASSWORD", "hunter2", actor=admin)
    await database_sync_to_async(do_save_startup_script)(
        cluster, event="node_boot", role="worker", body='echo "$BMC_PASSWORD"\n', timeout_s=30,
        validation=Validation())
    with counted_statements(monkeypatch) as statements:
        communicator, frames = await say_hello(node_token)
        await communicator.disconnect()
    assert len(statements.sql) == 4, statements.sql
    [script] = frames[-1]["startup_scripts"]
    assert script["env"] == {"BMC_PASSWORD": "hunter2"}


async def full_path_taken(monkeypatch):
    """Counts the hellos that reach gateway.ingest.accept_hello."""
    calls = []
    accept_hello = ingest.accept_hello

    def counted(grant, frame, now=None):
        calls.append(frame["node"])
        return accept_hello(grant, frame, now=now)

    monkeypatch.setattr(ingest, "accept_hello", counted)
    return calls


async def test_a_new_boot_id_takes_the_full_path(join_token, monkeypatch):
    node_token = await joined(join_token)
    calls = await full_path_taken(monkeypatch)
    communicator, _ = await say_hello(node_token, boot_id="boot-2")
    await communicator.disconnect()
    node = await database_sync_to_async(Node.objects.get)(name="gpu-001")
    assert calls == ["gpu-001"] and node.boot_id == "boot-2"


async def test_a_gpu_missing_from_the_hello_takes_the_full_path_every_time(join_token,
                                                                           monkeypatch):
    node_token = await joined(join_token)
    calls = await full_path_taken(monkeypatch)
    for _ in range(2):  # the GPU stays missing: no hello of it is a known one
        communicator, _ = await say_hello(node_token, gpus=GPUS[:7])
        await communicator.disconnect()
    assert calls == ["gpu-001", "gpu-001"]
    lost = await database_sync_to_async(HealthEvent.objects.select_related("gpu").get)(
        signature="gpu_lost")
    assert lost.gpu.uuid == GPUS[7]["uuid"]


async def test_a_changed_slurm_state_or_agent_version_takes_the_full_path(join_token,
                                                                          monkeypatch):
    node_token = await joined(join_token)
    calls = await full_path_taken(monkeypatch)
    communicator, _ = await say_hello(node_token, slurm={"state": "DRAIN", "reason": "x"})
    await communicator.disconnect()
    communicator, _ = await say_hello(node_token, slurm={"state": "DRAIN", "reason": "x"},
                                      agent_version="1.0.1")
    await communicator.disconnect()
    node = await database_sync_to_async(Node.objects.get)(name="gpu-001")
    assert len(calls) == 2 and (node.slurm_state, node.agent_version) == ("DRAIN", "1.0.1")
    communicator, _ = await say_hello(node_token, slurm={"state": "DRAIN", "reason": "x"},
                                      agent_version="1.0.1")
    await communicator.disconnect()
    assert len(calls) == 2  # nothing changed since: the known path


async def test_work_owed_to_the_node_goes_out_after_its_hello(join_token, monkeypatch):
    node_token = await joined(join_token)
    node = await database_sync_to_async(Node.objects.get)(name="gpu-001")
    run, _ = await database_sync_to_async(do_request_check)(node, "gpu_compute")
    calls = await full_path_taken(monkeypatch)
    communicator = await connect(node_token)
    await send(communicator, hello())
    frames = [await receive(communicator) for _ in range(3)]
    await communicator.disconnect()
    assert [frame["type"] for frame in frames] == ["welcome", "config", "run_check"]
    assert frames[2]["run_id"] == run.pk and calls == ["gpu-001"]
    run = await database_sync_to_async(CheckRun.objects.get)(pk=run.pk)
    assert run.status == CheckRun.Status.RUNNING


async def test_work_queued_while_the_known_hello_runs_is_offered_to_this_connection(
        join_token, monkeypatch):
    """The connection is in its node's group before the hello reads what is owed: an offer
    made while the hello runs (the publisher's, from the change feed) reaches it."""
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    from gateway import reconnects

    node_token = await joined(join_token)
    node = await database_sync_to_async(Node.objects.get)(name="gpu-001")
    welcome_known_node = reconnects.welcome_known_node

    def queue_while_welcoming(grant, frame, now=None):
        known = welcome_known_node(grant, frame, now=now)
        command = do_send_command(node, "reboot")
        async_to_sync(get_channel_layer().group_send)(
            agent_group(node.pk), {"type": "work.offer", "kind": "command", "id": command.pk})
        return known

    monkeypatch.setattr(reconnects, "welcome_known_node", queue_while_welcoming)
    communicator = await connect(node_token)
    await send(communicator, hello())
    frames = [await receive(communicator) for _ in range(3)]
    assert [frame["type"] for frame in frames] == ["welcome", "config", "command"]
    assert frames[2]["action"] == "reboot"
    await communicator.disconnect()


async def test_a_token_revoked_between_connect_and_hello_is_closed_4401(join_token):
    node_token = await joined(join_token)
    communicator = await connect(node_token)
    token = await database_sync_to_async(AgentToken.objects.get)(kind=AgentToken.Kind.NODE)
    await database_sync_to_async(do_revoke_agent_token)(token)
    await send(communicator, hello())
    assert await closed_with(communicator) == 4401


async def test_a_node_token_with_another_nodes_name_does_not_replace_that_nodes_connection(
        join_token):
    node_token = await joined(join_token)
    live, _ = await say_hello(node_token)
    stranger = await connect(node_token)
    await send(stranger, hello(node="gpu-002"))
    assert await closed_with(stranger) == 4403
    await send(live, event())
    assert (await receive(live))["type"] == "ack"  # still connected, not replaced
    await live.disconnect()


async def test_a_node_whose_acceptance_is_pending_takes_the_full_path(join_token,
                                                                      monkeypatch):
    node_token = await joined(join_token)
    await database_sync_to_async(Node.objects.filter(name="gpu-001").update)(
        acceptance_required=True)
    calls = await full_path_taken(monkeypatch)
    communicator, _ = await say_hello(node_token)
    await communicator.disconnect()
    assert calls == ["gpu-001"]


async def test_a_join_token_notes_its_last_use(join_token):
    communicator, _ = await join(join_token)
    await communicator.disconnect()
    token = await database_sync_to_async(AgentToken.objects.get)(kind=AgentToken.Kind.JOIN)
    assert token.last_used_at is not None
    assert timezone.now() - token.last_used_at < timedelta(minutes=1)


async def test_people_s_pages_answer_while_the_agents_database_work_is_held_up(
        join_token, monkeypatch):
    """Agents' database work runs on the gateway's threads, never on the one thread that
    Django's sync views share: a view answers while an event batch is stuck."""
    node_token = await joined(join_token)
    from gateway import event_batches

    release = threading.Event()
    ingest_events = ingest.ingest_events

    def stuck(items, now=None):
        release.wait(10)
        return ingest_events(items, now=now)

    monkeypatch.setattr(event_batches.ingest, "ingest_events", stuck)
    communicator, _ = await say_hello(node_token)
    await send(communicator, event())
    await asyncio.sleep(0.2)  # the batch is on the writer's thread, waiting
    try:
        page = HttpCommunicator(application, "GET", "/healthz",
                                headers=[(b"host", b"testserver")])
        response = await page.get_response(timeout=3)
    finally:
        release.set()
    assert response["status"] == 200
    assert (await receive(communicator))["type"] == "ack"
    await communicator.disconnect()
