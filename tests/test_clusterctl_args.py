"""clusterctl's arguments and tables as a newcomer guesses them (issue 27): a noun alone
lists, and times are local to the second unless --json."""

import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))

from clusterctl.main import local_time, parser, table, with_list_by_default  # noqa: E402


@pytest.mark.parametrize("argv, expected", [
    (["nodes"], ["nodes", "list"]),
    (["repairs"], ["repairs", "list"]),
    (["--json", "--cluster", "demo", "events", "--open"],
     ["--json", "--cluster", "demo", "events", "list", "--open"]),
    (["--url", "http://x", "nodes", "--state", "unhealthy"],
     ["--url", "http://x", "nodes", "list", "--state", "unhealthy"]),
    (["nodes", "pause", "gpu-001", "--reason", "r"], ["nodes", "pause", "gpu-001", "--reason", "r"]),
    (["--cluster", "nodes", "repairs"], ["--cluster", "nodes", "repairs", "list"]),
    ([], []),
])
def test_a_noun_alone_lists(argv, expected):
    assert with_list_by_default(argv) == expected


def test_every_noun_alone_parses_as_its_list():
    for noun in ("clusters", "nodes", "events", "repairs", "checks"):
        args = parser().parse_args(with_list_by_default([noun]))
        assert (args.noun, args.verb) == (noun, "list")


def test_times_are_local_to_the_second():
    moment = datetime(2026, 12, 3, 7, 5, 9, 123456, tzinfo=timezone.utc)
    assert local_time("2026-12-03T07:05:09.123456Z") == moment.astimezone().strftime(
        "%Y-%m-%d %H:%M:%S")
    assert local_time("2026-12-03T07:05:09.123+00:00") == local_time("2026-12-03T07:05:09Z")
    for other in ("gpu-001", "2026-12-03", "2026-12-03T07:05:09", 12, None):
        assert local_time(other) == other
    text = table([{"name": "gpu-001", "last_seen": "2026-12-03T07:05:09.123456Z"}],
                 [("NAME", "name"), ("LAST SEEN", "last_seen")])
    assert ".123456" not in text and local_time("2026-12-03T07:05:09Z") in text
