"""The live fold (nodes/live_fold.py): sums kept as samples arrive give what adding up every
node's latest sample gives, in embedded mode and across server processes through Redis."""

import random
from datetime import datetime, timedelta, timezone as dt_timezone

import orjson
import pytest

from gateway.protocol import live_sample
from nodes.live_fold import ClusterFold, NodeMinute
from nodes.live_store import MemoryLiveStore, decode_entry, encode_entry
from nodes.rollups import GPU_METRICS, NODE_METRICS, mean_and_peak, reading

GIB = 2**30
STALE_S = 15.0


def sample(node_id, received_at, rng, complete=False):
    """A LiveSample of 8 GPUs with every kind of reading a sample may carry: missing, out of
    range, a GPU whose memory total is unknown. A `complete` one has every reading, as a
    healthy H200's samples do; its GPUs' memory totals are still known or not."""

    def some(value, *no_reading):
        """The value, or at random one of `no_reading` unless the sample is complete."""
        return value if complete else rng.choice([value, *no_reading])

    gpus = []
    totals = {}
    for index in range(8):
        uuid = f"GPU-{node_id}-{index}"
        gpus.append({
            "uuid": uuid,
            "util_pct": some(rng.choice([rng.uniform(0, 100), 95.0]), None, 1e308),
            "mem_used_bytes": some(rng.randrange(0, 141 * GIB), None),
            "sm_clock_mhz": some(rng.randrange(900, 1980), None),
            "sm_active_pct": some(rng.uniform(0, 100), None),
            "temp_c": 50, "power_w": 600.0, "clock_event_reasons": 4,
        })
        if rng.random() < 0.9:
            totals[uuid] = 141 * GIB
    frame = {"type": "sample", "seq": 1, "ts": received_at, "gpus": gpus,
             "node": {"net_rx_bps": some(rng.uniform(0, 4e11), None),
                      "net_tx_bps": rng.uniform(0, 4e11), "cpu_pct": 10.0}}
    return live_sample(frame, node_id=node_id, received_at=received_at, memory_totals=totals)


def node_reading(sample, min_util_pct):
    """The sample's NodeReading, as the live store's record() has it made."""
    return NodeMinute().add(sample, min_util_pct)


def as_entry(sample):
    """The sample's entry, as the live store's readers have it."""
    return decode_entry(encode_entry(sample))


def usage_by_adding_up(latest, now_ts):
    """What the publisher computed before the fold: every fresh node's latest sample, added."""
    utils, sm_active, used, total, net, gpus = [], [], 0, 0, 0.0, 0
    for entry in map(as_entry, latest.values()):
        if now_ts - entry["received_at"] > STALE_S:
            continue
        for gpu in entry["gpus"]:
            gpus += 1
            if reading(gpu["util_pct"]) is not None:
                utils.append(gpu["util_pct"])
            if gpu["sm_active_pct"] is not None:
                sm_active.append(gpu["sm_active_pct"])
            if reading(gpu["mem_used_bytes"]) is not None and reading(gpu["mem_total_bytes"]):
                used += gpu["mem_used_bytes"]
                total += gpu["mem_total_bytes"]
        net += (reading(entry["node"]["net_rx_bps"]) or 0) + (
            reading(entry["node"]["net_tx_bps"]) or 0)
    if not gpus:
        return None
    return {"gpus_reporting": gpus, "gpu_util_pct": sum(utils) / len(utils) if utils else 0.0,
            "gpu_mem_used_pct": 100.0 * used / total if total else 0.0, "net_bps": net,
            "gpu_sm_active_pct": sum(sm_active) / len(sm_active) if sm_active else None}


def assert_same_usage(folded, added):
    assert (folded is None) == (added is None)
    if added is not None:
        assert folded["gpus_reporting"] == added["gpus_reporting"]
        for key in ("gpu_util_pct", "gpu_mem_used_pct", "net_bps"):
            assert folded[key] == pytest.approx(added[key], rel=1e-9, abs=1e-6)
        assert folded["gpu_sm_active_pct"] == pytest.approx(added["gpu_sm_active_pct"], rel=1e-9)


@pytest.mark.parametrize("complete", [False, True], ids=["readings-missing", "complete"])
def test_the_running_sums_are_the_sum_of_every_fresh_nodes_latest_sample(complete):
    """600 ticks of 50 nodes that report at random, some out of order, some going silent for
    longer than the stale time and coming back: after every tick the fold's usage is what
    adding up each fresh node's newest sample gives."""
    rng = random.Random(25)
    fold, latest = ClusterFold(), {}
    for tick in range(600):
        now_ts = 1_764_442_000.0 + tick
        for node_id in range(1, 51):
            silent = (tick // 40 + node_id) % 5 == 0  # 40 s silences
            if not silent and rng.random() < 0.6:
                entry = sample(node_id, now_ts - rng.uniform(0, 2), rng, complete)
                if node_id not in latest or entry.received_at >= latest[node_id].received_at:
                    latest[node_id] = entry  # an older reading come late is not taken
                fold.add(node_reading(entry, 90.0))
        fold.expire(now_ts - STALE_S)
        assert_same_usage(fold.usage(), usage_by_adding_up(latest, now_ts))
        fresh = {n for n, e in latest.items() if now_ts - e.received_at <= STALE_S}
        assert set(fold.readings) == fresh
    # A node is kept once a second at most, and only for the seconds not yet stale.
    assert sum(map(len, fold.by_second.values())) <= 50 * (STALE_S + 3)


def test_a_stale_reading_is_not_heard_and_nothing_left_sums_to_exactly_nothing():
    rng = random.Random(1)
    fold = ClusterFold()
    fold.add(node_reading(sample(1, 1000.0, rng), 90.0))
    fold.add(node_reading(sample(2, 980.0, rng), 90.0))
    fold.expire(1000.0 - STALE_S)
    assert fold.take_heard() == {1: 1000.0}
    assert fold.take_heard() == {}
    fold.expire(2000.0)
    assert fold.usage() is None and fold.sums == [0] * 8


def test_only_gpus_at_load_with_a_clock_reach_the_slow_gpu_rule():
    rng = random.Random(2)
    entry = sample(1, 1000.0, rng)
    at_load = node_reading(entry, 90.0).at_load
    expected = [gpu.uuid for gpu in entry.gpus if gpu.util_pct is not None
                and gpu.util_pct >= 90.0 and gpu.sm_clock_mhz is not None]
    assert [gpu[0] for gpu in at_load] == expected
    assert all(gpu[3:] == (50, 600.0, 4) for gpu in at_load)


def test_a_nodes_minute_is_the_mean_and_peak_of_its_samples():
    minute = datetime(2026, 12, 2, 9, 30, tzinfo=dt_timezone.utc)
    node_minute = NodeMinute()
    rng = random.Random(3)
    for second, util in [(1, 10.0), (2, 20.0), (50, 60.0)]:
        entry = sample(7, (minute + timedelta(seconds=second)).timestamp(), rng)
        entry.gpus[0].util_pct = util
        node_minute.add(entry, 90.0)
    assert node_minute.finish_if_new_minute(minute + timedelta(seconds=59)) is None
    finished_minute, gpus, nodes = node_minute.finish_if_new_minute(minute + timedelta(minutes=1))
    assert finished_minute == minute and list(nodes) == [7]
    assert gpus[7]["GPU-7-0"][:3] == [90.0, 3, 60.0]  # total, count, peak of util_pct
    assert node_minute.finish_if_new_minute(minute + timedelta(minutes=1, seconds=5)) is None


def test_a_minute_of_complete_samples_and_samples_with_readings_missing():
    """A sample with every reading and one with some missing count each reading where it
    is: a GPU's mean is over the samples that had it."""
    minute = datetime(2026, 12, 2, 9, 30, tzinfo=dt_timezone.utc)
    node_minute = NodeMinute()
    rng = random.Random(6)
    for second, util, power in [(1, 10.0, 600.0), (2, None, 700.0), (3, 40.0, None)]:
        entry = sample(7, (minute + timedelta(seconds=second)).timestamp(), rng, complete=True)
        entry.gpus[0].util_pct, entry.gpus[0].power_w = util, power
        node_minute.add(entry, 90.0)
    _, gpus, nodes = node_minute.finish_if_new_minute(minute + timedelta(minutes=1))
    assert mean_and_peak(gpus[7]["GPU-7-0"], GPU_METRICS)["util_pct"] == [25.0, 40.0]
    assert mean_and_peak(gpus[7]["GPU-7-0"], GPU_METRICS)["power_w"] == [650.0, 700.0]
    assert mean_and_peak(gpus[7]["GPU-7-0"], GPU_METRICS)["temp_c"] == [50.0, 50]
    assert mean_and_peak(nodes[7], NODE_METRICS)["cpu_pct"] == [10.0, 10.0]


def test_a_gpu_gone_within_the_minute_keeps_its_part_of_the_minute():
    """A GPU falls off the bus after two samples and is back for the last: each GPU's minute
    counts the samples it was in, the node's every sample."""
    minute = datetime(2026, 12, 2, 9, 30, tzinfo=dt_timezone.utc)
    node_minute = NodeMinute()
    rng = random.Random(7)
    for second in range(5):
        entry = sample(7, (minute + timedelta(seconds=second)).timestamp(), rng, complete=True)
        for gpu in entry.gpus:
            gpu.temp_c = 40 + second
        if second in (2, 3):
            entry = entry._replace(gpus=entry.gpus[:3] + entry.gpus[4:],
                                   mem_totals=entry.mem_totals[:3] + entry.mem_totals[4:])
        reading = node_minute.add(entry, 90.0)
        assert reading.gpus == len(entry.gpus)
    _, gpus, nodes = node_minute.finish_if_new_minute(minute + timedelta(minutes=1))
    assert sorted(gpus[7]) == [f"GPU-7-{index}" for index in range(8)]
    assert mean_and_peak(gpus[7]["GPU-7-3"], GPU_METRICS)["temp_c"] == [125 / 3, 44]  # 40, 41, 44
    assert mean_and_peak(gpus[7]["GPU-7-4"], GPU_METRICS)["temp_c"] == [42.0, 44]
    assert nodes[7][4] == 5  # net_tx_bps: every sample


def gpus_kept(node_id, second, rng):
    """The GPUs in a sample of test_a_minute_of_random_samples...: node 1's come and go at
    random, node 2's GPU 3 is gone for ten seconds, node 3 keeps all of its."""
    if node_id == 1:
        return [index for index in range(8) if rng.random() < 0.9]
    if node_id == 2:
        return [index for index in range(8) if index != 3 or not 20 <= second < 30]
    return list(range(8))


@pytest.mark.parametrize("complete", [False, True], ids=["readings-missing", "complete"])
def test_a_minute_of_random_samples_is_each_readings_mean_and_peak(complete):
    """Nodes whose GPUs come and go within the minute, one of them sampling five times a
    second, their samples complete or with readings missing: each GPU's and node's minute is
    the mean and peak of the readings its samples had, computed here one by one."""
    minute = datetime(2026, 12, 2, 9, 30, tzinfo=dt_timezone.utc)
    rng = random.Random(8)
    node_minute, seen = NodeMinute(), {}  # seen: (node id, uuid or None, metric) -> readings
    for tenth in range(600):
        second = tenth // 10
        for node_id, every in ((1, 10), (2, 10), (3, 2)):
            if tenth % every:
                continue
            entry = sample(node_id, (minute + timedelta(seconds=tenth / 10)).timestamp(), rng,
                           complete)
            kept = gpus_kept(node_id, second, rng)
            entry = entry._replace(gpus=[entry.gpus[i] for i in kept],
                                   mem_totals=[entry.mem_totals[i] for i in kept])
            node_minute.add(entry, 90.0)
            for gpu in entry.gpus:
                for metric in GPU_METRICS:
                    seen.setdefault((node_id, gpu.uuid, metric), []).append(getattr(gpu, metric))
            for metric in NODE_METRICS:
                seen.setdefault((node_id, None, metric), []).append(getattr(entry.node, metric))
    _, gpus, nodes = node_minute.finish_if_new_minute(minute + timedelta(minutes=1))
    for node_id in (1, 2, 3):
        for (seen_node, uuid, metric), values in seen.items():
            if seen_node != node_id:
                continue
            got = (mean_and_peak(nodes[node_id], NODE_METRICS) if uuid is None else
                   mean_and_peak(gpus[node_id][uuid], GPU_METRICS))[metric]
            readings = [value for value in values if value is not None]
            if not readings:
                assert got == [None, None]
            else:
                assert got == [pytest.approx(sum(readings) / len(readings), rel=1e-12),
                               max(readings)]


def test_the_embedded_store_folds_what_it_records():
    store = MemoryLiveStore()
    rng = random.Random(4)
    entry = sample(3, 1000.0, rng)
    store.record(9, entry)
    assert store.fold.cluster(9).readings[3] == node_reading(entry, 90.0)
    assert store.read_node(9, 3) == as_entry(entry)


@pytest.mark.asyncio
async def test_in_production_the_leader_folds_the_readings_of_every_process(redis_live_store):
    """Two server processes record samples, one of them the same node (it reconnected to the
    other process): the leader's fold, read through Redis, counts it once, with its newest
    sample, and has every reading a process flushed."""
    rng = random.Random(5)
    first, second, leader = redis_live_store(), redis_live_store(), redis_live_store()
    latest = {}
    for node_id in range(1, 41):
        entry = sample(node_id, 1000.0 + node_id / 100, rng)
        (first if node_id % 2 else second).record(1, entry)
        latest[node_id] = entry
    moved = sample(1, 1001.0, rng)
    second.record(1, moved)
    latest[1] = moved
    try:
        await first.flush()
        await second.flush()
        fold = await leader.read_fold()
        cluster_fold = fold.cluster(1)
        cluster_fold.expire(1001.0 - STALE_S)
        assert set(cluster_fold.readings) == set(latest)
        folded, expected = cluster_fold.readings[1], node_reading(moved, 90.0)
        assert folded[:8] == expected[:8]
        assert [tuple(gpu) for gpu in folded.at_load] == list(expected.at_load)
        assert_same_usage(cluster_fold.usage(), usage_by_adding_up(latest, 1001.0))
        assert (await leader.read_fold()).cluster(1).take_heard() == {
            node_id: entry.received_at for node_id, entry in latest.items()}
        assert (await leader.read_fold()).cluster(1).take_heard() == {}  # each read once
    finally:
        for store in (first, second, leader):
            await store.close()


@pytest.mark.asyncio
async def test_in_production_the_leader_writes_the_fleets_minute_and_the_others_fold_nothing(
        redis_live_store):
    """Three processes record a minute of 30 nodes' samples, some of them faster than one a
    second, one of them the leader: the leader's minute is the minute one process folding
    every sample has, and the two others keep no minute and no fold of their own."""
    rng = random.Random(7)
    first, second, leader = redis_live_store(), redis_live_store(), redis_live_store()
    leader.set_leading(True)
    one_process = MemoryLiveStore()
    minute = datetime(2026, 12, 5, 3, 0, tzinfo=dt_timezone.utc)
    try:
        for second_of_minute in range(60):
            for node_id in range(1, 31):
                for twice in range(1 + (node_id % 3 == 0)):
                    entry = sample(node_id, minute.timestamp() + second_of_minute + twice / 2,
                                   rng)
                    (first, second, leader)[(node_id + second_of_minute) % 3].record(2, entry)
                    one_process.record(2, entry)
            for store in (first, second, leader):
                await store.flush()
            if second_of_minute % 7 == 0:
                await leader.read_fold()
        await leader.read_fold()
        for store in (first, second):
            assert store.node_minute.gpus == {} and store.fold.clusters == {}
        ended = minute + timedelta(minutes=1)
        _, gpus, nodes = leader.node_minute.finish_if_new_minute(ended)
        _, expected_gpus, expected_nodes = one_process.node_minute.finish_if_new_minute(ended)
        assert set(gpus) == set(expected_gpus) == set(range(1, 31))
        for node_id, node_gpus in expected_gpus.items():
            assert nodes[node_id] == pytest.approx(expected_nodes[node_id])
            assert gpus[node_id].keys() == node_gpus.keys()
            for uuid, stats in node_gpus.items():
                assert gpus[node_id][uuid] == pytest.approx(stats)
        assert_same_usage(leader.fold.cluster(2).usage(), one_process.fold.cluster(2).usage())
    finally:
        for store in (first, second, leader):
            await store.close()


@pytest.mark.asyncio
async def test_the_leader_folds_its_own_readings_as_it_records_them(redis_live_store):
    """The leader's own samples skip the round trip through Redis; another process's reach
    it through Redis; and one that stops leading sends its readings to the new leader."""
    rng = random.Random(6)
    leader, other = redis_live_store(), redis_live_store()
    leader.set_leading(True)
    own, others = sample(1, 1000.0, rng), sample(2, 1000.0, rng)
    try:
        leader.record(1, own)
        assert leader.fold.cluster(1).readings[1] == node_reading(own, 90.0)
        other.record(1, others)
        await leader.flush()
        await other.flush()
        fold = await leader.read_fold()
        assert set(fold.cluster(1).readings) == {1, 2}
        assert fold.cluster(1).take_heard() == {1: 1000.0, 2: 1000.0}  # each heard once

        leader.set_leading(False)
        # It lets go of its fold and its unfinished minute: the new leader writes the minute.
        assert leader.fold.clusters == {} and leader.node_minute.gpus == {}
        other.set_leading(True)
        leader.record(1, sample(1, 1001.0, rng))
        await leader.flush()
        assert (await other.read_fold()).cluster(1).take_heard() == {1: 1001.0}
        assert leader.read_node(1, 1)["received_at"] == 1001.0  # every process reads the hash
    finally:
        for store in (leader, other):
            await store.close()


def test_an_entry_written_before_the_memory_totals_moved_out_of_the_gpus_still_reads():
    """Entries of nodes that stopped reporting stay in a cluster's hash through an upgrade."""
    old = {"node_id": 3, "seq": 1, "ts": 1.0, "received_at": 1.0, "hygiene": None,
           "gpus": [{"uuid": "GPU-1", "util_pct": 5, "mem_total_bytes": 80}],
           "node": {"cpu_pct": 1.0}}
    assert decode_entry(orjson.dumps(old)) == old


def test_an_older_reading_come_late_does_not_replace_a_newer_one():
    """A node that moved to the leader's own process: its last reading from the process it
    left reaches the fold through Redis after newer ones."""
    rng = random.Random(7)
    fold = ClusterFold()
    newer, older = sample(1, 1001.0, rng), sample(1, 1000.5, rng)
    fold.add(node_reading(newer, 90.0))
    fold.add(node_reading(older, 90.0))
    assert fold.readings[1] == node_reading(newer, 90.0)
    assert fold.take_heard() == {1: 1001.0}
    assert_same_usage(fold.usage(), usage_by_adding_up({1: newer}, 1001.0))


@pytest.mark.asyncio
async def test_an_entry_the_leader_cannot_read_is_left_out_and_the_rest_folded(redis_live_store,
                                                                             caplog):
    """Another version's entry (a rolling upgrade) costs the leader that entry, not the
    second's fold."""
    from nodes.live_store import SAMPLES_KEY

    rng = random.Random(8)
    other, leader = redis_live_store(), redis_live_store()
    leader.set_leading(True)
    entry = sample(4, 1000.0, rng)
    try:
        await other.client.rpush(SAMPLES_KEY, b'3\n{"node_id": 9, "gpus": "none"}\n[]')
        other.record(3, entry)
        await other.flush()
        fold = await leader.read_fold()
        assert set(fold.cluster(3).readings) == {4}
        assert fold.cluster(3).readings[4][:8] == node_reading(entry, 90.0)[:8]
        assert ("2 lines of the samples handed over through Redis could not be read"
                in caplog.text)
    finally:
        for store in (other, leader):
            await store.close()
