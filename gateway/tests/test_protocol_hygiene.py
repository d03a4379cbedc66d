"""sample.hygiene (node hygiene, issue 17): validated by the exact path, within PROTOCOL.md's
limit classes, and kept (its known fields only) with the node's live entry."""

import json

import pytest

from gateway.protocol import known_hygiene, live_sample
from nodes.live_store import MemoryLiveStore
from gateway.protocol import BadFrame, fast_sample, parse_frame

HYGIENE = {
    "slurmd": {"state": "running", "pid": 4242, "since": 1764440000.5, "restarts": 2,
               "last_restart_at": 1764441000.0, "watched_by": "process", "restart": True},
    "processes": {"zombies": 12, "orphans": 3, "tasks": 1800, "pid_max": 4194304,
                  "checked_at": 1764442000.0},
    "gres": {"match": False, "nvml_gpus": 8, "slurm_gpus": 7, "checked_at": 1764442000.0,
             "not_compared": None},
}
SAMPLE = {"type": "sample", "seq": 3, "ts": 1764442000.1,
          "gpus": [{"uuid": "GPU-dd6e", "util_pct": 100}], "node": {"cpu_pct": 1.5},
          "hygiene": HYGIENE}


def test_a_sample_with_hygiene_is_valid_and_kept_whole():
    text = json.dumps(SAMPLE)
    assert parse_frame(text) == SAMPLE


def test_a_sample_with_hygiene_skips_the_fast_path():
    text = json.dumps(SAMPLE)
    assert fast_sample(text) is None
    plain = json.dumps({key: value for key, value in SAMPLE.items() if key != "hygiene"})
    assert fast_sample(plain) is not None


@pytest.mark.parametrize("part, field, value, message", [
    ("processes", "zombies", -1, "sample.hygiene.processes.zombies: expected an integer from 0"),
    ("processes", "zombies", "12", "sample.hygiene.processes.zombies: expected an integer"),
    ("processes", "tasks", 1.5, "sample.hygiene.processes.tasks: expected an integer"),
    ("slurmd", "state", "x" * 17, "sample.hygiene.slurmd.state: expected at most 16 characters"),
    ("slurmd", "restart", "yes", "sample.hygiene.slurmd.restart: expected true or false"),
    ("gres", "match", 1, "sample.hygiene.gres.match: expected true or false"),
    ("gres", "checked_at", "now", "sample.hygiene.gres.checked_at: expected a number"),
])
def test_a_bad_hygiene_reading_is_refused_naming_it(part, field, value, message):
    frame = json.loads(json.dumps(SAMPLE))
    frame["hygiene"][part][field] = value
    with pytest.raises(BadFrame) as caught:
        parse_frame(json.dumps(frame))
    assert caught.value.message.startswith(message)


def test_hygiene_that_is_not_an_object_is_refused():
    with pytest.raises(BadFrame, match="sample.hygiene.slurmd: expected an object"):
        parse_frame(json.dumps({**SAMPLE, "hygiene": {"slurmd": [1]}}))


def test_the_live_entry_keeps_the_known_hygiene_fields_only():
    sent = json.loads(json.dumps(HYGIENE))
    sent["slurmd"]["future_field"] = "x" * 5000
    sent["something_new"] = {"a": 1}
    kept = known_hygiene(sent)
    assert kept == HYGIENE
    store = MemoryLiveStore()
    store.record(1, live_sample(SAMPLE, node_id=1, received_at=1.0, memory_totals={},
                                hygiene=kept))
    assert store.read_node(1, 1)["hygiene"] == HYGIENE
    assert known_hygiene(None) is None
    store.record(1, live_sample(SAMPLE, node_id=1, received_at=2.0, memory_totals={}))
    assert store.read_node(1, 1)["hygiene"] is None
