"""clusterctl's arguments and tables as a newcomer guesses them (issue 27): a noun alone
lists, and times are local to the second unless --json."""

import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))

from clusterctl import main as clusterctl_main  # noqa: E402
from clusterctl.main import Api, local_time, parser, table, with_list_by_default  # noqa: E402


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


class ListOfNumbers(Api):
    """An API whose list is the numbers 0 to total - 1, paged as /api/v1/ pages; it notes
    each (limit, offset) asked for."""

    def __init__(self, total):
        super().__init__("http://clusterui.invalid", "cui_test")
        self.total, self.asked = total, []

    def get(self, path, **params):
        limit, offset = params["limit"], params["offset"]
        self.asked.append((limit, offset))
        end = offset + limit
        return {"count": self.total, "limit": limit, "offset": offset,
                "next_offset": end if end < self.total else None,
                "items": list(range(self.total))[offset:end]}


def test_a_list_follows_every_page(monkeypatch):
    monkeypatch.setattr(clusterctl_main, "PAGE_SIZE", 2)
    api = ListOfNumbers(5)
    assert api.items("/clusters/demo/nodes/") == [0, 1, 2, 3, 4]
    assert api.asked == [(2, 0), (2, 2), (2, 4)]


def test_a_list_stops_at_the_users_limit(monkeypatch):
    monkeypatch.setattr(clusterctl_main, "PAGE_SIZE", 2)
    api = ListOfNumbers(5)
    assert api.items("/clusters/demo/nodes/", limit=3) == [0, 1, 2]
    assert api.asked == [(2, 0), (1, 2)]
    assert ListOfNumbers(1).items("/clusters/demo/nodes/", limit=3) == [0]


def test_every_list_takes_a_limit():
    for noun in ("clusters", "nodes", "events", "repairs", "checks"):
        assert parser().parse_args([noun, "list", "--limit", "7"]).limit == 7
        assert parser().parse_args([noun, "list"]).limit is None
    for bad in ("0", "-1", "many"):
        with pytest.raises(SystemExit):
            parser().parse_args(["nodes", "list", "--limit", bad])
