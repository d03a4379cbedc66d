"""Fuzzed frames of every type against the agent WebSocket and the database (issue 15): the
socket stays up, no frame is answered server_error, every event gets its answer, and a
normal event after each fuzzed frame is acked (bench/fuzz/frames.py says how). A few
hundred frames here; bench/fuzz/run.py sends 10,000 a type to daphne."""

import json

import pytest

from bench.fuzz.frames import FRAME_TYPES, Closed, fuzz
from gateway.tests.test_consumers import GPUS, hello, join

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("in_memory_channel_layer")]

FRAMES_PER_TYPE = 60


class Connection:
    """A WebsocketCommunicator as bench.fuzz.frames.fuzz() wants it."""

    def __init__(self, communicator):
        self.communicator = communicator

    async def send(self, text):
        await self.communicator.send_to(text_data=text)

    async def receive(self):
        message = await self.communicator.receive_output(timeout=10)
        if message["type"] == "websocket.close":
            await self.communicator.wait()
            raise Closed(message.get("code"))
        return json.loads(message["text"])

    async def close(self):
        await self.communicator.disconnect()


@pytest.mark.parametrize("frame_type", FRAME_TYPES)
async def test_fuzzed_frames_are_each_answered_and_the_socket_stays_up(join_token, frame_type,
                                                                       settings):
    # The rate limits out of reach: every frame is read exactly (test_consumer_floods.py).
    settings.CLUSTERUI_AGENT_FRAMES_PER_S = settings.CLUSTERUI_AGENT_FRAME_BURST = 10 ** 9
    first, welcome = await join(join_token)
    await first.disconnect()
    node_token = welcome["node_token"]

    async def open_connection():
        communicator, _ = await join(node_token)
        return Connection(communicator)

    tally = await fuzz(open_connection, frame_type, FRAMES_PER_TYPE, seed=frame_type,
                       node=hello()["node"], gpu_uuids=[gpu["uuid"] for gpu in GPUS])
    print(tally)
    assert tally.frames == FRAMES_PER_TYPE
    assert tally.probes_acked + sum(tally.closes.values()) == FRAMES_PER_TYPE
    assert set(tally.closes) <= {4400, 4403}
