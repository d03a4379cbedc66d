"""clusterctl: clusterui's JSON API from a shell. Tables for people, --json for scripts."""

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path

TIMEOUT_S = 30
PAGE_SIZE = 100  # items a request asks for: the API's default limit


class ApiError(Exception):
    """What the API said went wrong (its problem detail), or why it could not be asked."""


class Api:
    def __init__(self, url, token):
        self.base = url.rstrip("/") + "/api/v1"
        self.token = token

    def request(self, method, path, params=None, body=None):
        query = "?" + urllib.parse.urlencode(
            {k: v for k, v in (params or {}).items() if v not in (None, "", False)}, doseq=True)
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path + (query if query != "?" else ""),
                                         data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise ApiError(problem_text(exc.code, exc.read())) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ApiError(f"cannot reach {self.base}: {getattr(exc, 'reason', exc)}") from None

    def get(self, path, **params):
        return self.request("GET", path, params)

    def post(self, path, body=None):
        return self.request("POST", path, body=body or {})

    def items(self, path, limit=None, **params):
        """A list's items, page after page (limit and offset) until its last page, or until
        `limit` items when one is given."""
        found, offset = [], 0
        while offset is not None and (limit is None or len(found) < limit):
            wanted = PAGE_SIZE if limit is None else min(PAGE_SIZE, limit - len(found))
            answer = self.get(path, limit=wanted, offset=offset, **params)
            found += answer["items"]
            offset = answer["next_offset"]
        return found


def problem_text(status, raw):
    try:
        problem = json.loads(raw)
    except ValueError:
        return f"HTTP {status}"
    text = f"{problem.get('title', f'HTTP {status}')} ({status}): {problem.get('detail', '')}"
    for error in problem.get("errors", []):
        text += f"\n  {'.'.join(str(p) for p in error.get('loc', []))}: {error.get('msg', '')}"
    return text.rstrip(": ")


def read_token(environ):
    path = environ.get("CLUSTERCTL_TOKEN_FILE")
    if path:
        try:
            return Path(path).expanduser().read_text().strip()
        except OSError as exc:
            raise ApiError(f"CLUSTERCTL_TOKEN_FILE: {exc}") from None
    token = environ.get("CLUSTERCTL_TOKEN", "").strip()
    if not token:
        raise ApiError("no token: set CLUSTERCTL_TOKEN_FILE (a file holding it) or "
                       "CLUSTERCTL_TOKEN; make one on the console's API tokens page")
    return token


def local_time(value):
    """An API time (ISO 8601, UTC) as this machine's local time to the second; any other
    value as it is."""
    if not isinstance(value, str) or len(value) < 19 or value[10:11] != "T":
        return value
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return value
    if moment.tzinfo is None:
        return value
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def table(rows, columns):
    """Rows (dicts) as aligned text columns; `columns` are (heading, key or function). Times
    are local, to the second (--json keeps the API's)."""
    cells = [[str(value(row) if callable(value) else ("" if row.get(value) is None
                                                      else local_time(row.get(value))))
              for _, value in columns] for row in rows]
    headings = [heading for heading, _ in columns]
    widths = [max(len(text) for text in column) for column in zip(headings, *cells)]
    lines = ["  ".join(text.ljust(width) for text, width in zip(line, widths)).rstrip()
             for line in [headings, *cells]]
    return "\n".join(lines)


def live_util(node):
    live = node.get("live") or {}
    return "" if live.get("util_mean") is None else f"{live['util_mean']:.0f} %"


COLUMNS = {
    "clusters": [("SLUG", "slug"), ("NAME", "name"), ("NODES", "nodes"),
                 ("SCHEDULER", "scheduler"),
                 ("STATES", lambda c: ", ".join(f"{k} {v}" for k, v in
                                                sorted(c["nodes_by_state"].items())))],
    "nodes": [("NAME", "name"), ("STATE", "state"), ("ROLE", "role"), ("GPUS", "gpus"),
              ("UTIL", live_util), ("SIGNAL", "worst_signal")],
    "events": [("NODE", "node"), ("SIGNATURE", "signature"), ("SEVERITY", "severity"),
               ("COUNT", "count"), ("LAST SEEN", "last_seen"),
               ("OPEN", lambda e: "no" if e["closed_at"] else "yes"), ("ID", "id")],
    "repairs": [("#", "number"), ("NODE", "node"), ("ACTION", "action"), ("STATUS", "status"),
                ("SIGNATURE", "signature"), ("REQUESTED", "requested_at")],
    "checks": [("NODE", "node"), ("CHECK", "check"), ("PURPOSE", "purpose"),
               ("STATUS", "status"), ("REQUESTED", "requested_at"), ("ID", "id")],
    "commands": [("NODE", "node"), ("ACTION", "action"), ("STATUS", "status"),
                 ("REQUESTED", "requested_at"), ("ID", "id")],
}


def positive_int(text):
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"not a number of items: {text!r}")
    return int(text)


def add_limit(list_parser):
    list_parser.add_argument("--limit", type=positive_int,
                             help="at most this many items (default: all of them)")


def parser():
    main = argparse.ArgumentParser(prog="clusterctl", description=__doc__)
    main.add_argument("--url", default=os.environ.get("CLUSTERCTL_URL"),
                      help="the console (default: $CLUSTERCTL_URL)")
    main.add_argument("--cluster", default=os.environ.get("CLUSTERCTL_CLUSTER"),
                      help="the cluster's slug (default: $CLUSTERCTL_CLUSTER, or the only one)")
    main.add_argument("--json", action="store_true", help="print the API's JSON")
    nouns = main.add_subparsers(dest="noun", required=True)

    clusters = nouns.add_parser("clusters").add_subparsers(dest="verb", required=True)
    add_limit(clusters.add_parser("list"))

    nodes = nouns.add_parser("nodes").add_subparsers(dest="verb", required=True)
    node_list = nodes.add_parser("list")
    add_limit(node_list)
    for name in ("state", "role", "signature", "name"):
        node_list.add_argument(f"--{name}")
    pause = nodes.add_parser("pause")
    pause.add_argument("node")
    pause.add_argument("--reason", required=True)
    nodes.add_parser("resume").add_argument("node")
    nodes.add_parser("cleanup", help="end the orphans of ended jobs, signal zombies' parents"
                     ).add_argument("node")

    events = nouns.add_parser("events").add_subparsers(dest="verb", required=True)
    event_list = events.add_parser("list")
    add_limit(event_list)
    event_list.add_argument("--open", action="store_true", help="open events only")
    for name in ("severity", "signature", "node", "period"):
        event_list.add_argument(f"--{name}")
    events.add_parser("acknowledge").add_argument("id")
    silence = events.add_parser("silence")
    silence.add_argument("id")
    silence.add_argument("--hours", type=float, required=True)
    silence.add_argument("--reason", required=True)

    repairs = nouns.add_parser("repairs").add_subparsers(dest="verb", required=True)
    repair_list = repairs.add_parser("list")
    add_limit(repair_list)
    for name in ("status", "node", "action", "period"):
        repair_list.add_argument(f"--{name}")
    repairs.add_parser("show").add_argument("repair", help="its number (12) or id")
    for verb in ("approve", "reject", "cancel"):
        act = repairs.add_parser(verb)
        act.add_argument("repair", help="its number (12) or id")
        act.add_argument("--comment", default="")
        if verb == "approve":
            act.add_argument("--drain", choices=["now", "after_jobs", "signal"],
                             help="how the jobs are treated (default: as proposed)")
    go_on = repairs.add_parser("go-on-now", help="stop the jobs a drain waits for")
    go_on.add_argument("repair")
    go_on.add_argument("--comment", required=True)
    abort = repairs.add_parser("abort")
    abort.add_argument("repair")
    abort.add_argument("--comment", required=True)
    abort.add_argument("--resume-node", action="store_true",
                       help="resume the node (default: it stays paused)")
    propose = repairs.add_parser("propose")
    propose.add_argument("node")
    propose.add_argument("--action", required=True,
                         choices=["reboot", "reprovision", "failover", "remove"])
    propose.add_argument("--reason", required=True)

    checks = nouns.add_parser("checks").add_subparsers(dest="verb", required=True)
    check_list = checks.add_parser("list")
    add_limit(check_list)
    for name in ("node", "check", "status", "purpose"):
        check_list.add_argument(f"--{name}")
    run = checks.add_parser("run")
    run.add_argument("node")
    run.add_argument("--check", required=True, help="a check's name, or 'acceptance'")
    return main


def cluster_slug(api, args):
    if args.cluster:
        return args.cluster
    slugs = [cluster["slug"] for cluster in api.items("/clusters/")]
    if len(slugs) != 1:
        raise ApiError(f"name the cluster with --cluster (or CLUSTERCTL_CLUSTER): "
                       f"{', '.join(slugs) or 'there are none'}")
    return slugs[0]


def run(api, args):
    """(what to print: JSON data, the table's kind)."""
    if args.noun == "clusters":
        return api.items("/clusters/", limit=args.limit), "clusters"
    at = f"/clusters/{cluster_slug(api, args)}"
    if args.noun == "nodes":
        if args.verb == "list":
            return api.items(f"{at}/nodes/", limit=args.limit, state=args.state,
                             role=args.role, signature=args.signature, name=args.name), "nodes"
        if args.verb == "pause":
            return [api.post(f"{at}/nodes/{args.node}/pause/", {"reason": args.reason})], "nodes"
        if args.verb == "cleanup":
            return [api.post(f"{at}/nodes/{args.node}/cleanup/")], "commands"
        return [api.post(f"{at}/nodes/{args.node}/resume/")], "nodes"
    if args.noun == "events":
        if args.verb == "list":
            return api.items(f"{at}/events/", limit=args.limit,
                             open="true" if args.open else None, severity=args.severity,
                             signature=args.signature, node=args.node,
                             period=args.period), "events"
        if args.verb == "acknowledge":
            return [api.post(f"{at}/events/{args.id}/acknowledge/")], "events"
        return [api.post(f"{at}/events/{args.id}/silence/",
                         {"hours": args.hours, "reason": args.reason})], "events"
    if args.noun == "repairs":
        if args.verb == "list":
            return api.items(f"{at}/repairs/", limit=args.limit, status=args.status,
                             node=args.node, action=args.action, period=args.period), "repairs"
        if args.verb == "show":
            return [api.get(f"{at}/repairs/{args.repair}/")], "repairs"
        if args.verb == "abort":
            return [api.post(f"{at}/repairs/{args.repair}/abort/",
                             {"comment": args.comment, "resume_node": args.resume_node})], \
                "repairs"
        if args.verb == "go-on-now":
            return [api.post(f"{at}/repairs/{args.repair}/go-on-now/",
                             {"comment": args.comment})], "repairs"
        if args.verb == "approve":
            return [api.post(f"{at}/repairs/{args.repair}/approve/",
                             {"comment": args.comment, "drain_mode": args.drain})], "repairs"
        if args.verb == "propose":
            return [api.post(f"{at}/nodes/{args.node}/repairs/",
                             {"action": args.action, "reason": args.reason})], "repairs"
        return [api.post(f"{at}/repairs/{args.repair}/{args.verb}/",
                         {"comment": args.comment})], "repairs"
    if args.verb == "list":
        return api.items(f"{at}/checks/", limit=args.limit, node=args.node, check=args.check,
                         status=args.status, purpose=args.purpose), "checks"
    return api.post(f"{at}/nodes/{args.node}/checks/", {"check": args.check}), "checks"


# Options before the noun that take a value.
GLOBAL_OPTIONS_WITH_VALUES = ("--url", "--cluster")


def with_list_by_default(argv):
    """argv with "list" after a noun that names no verb: `clusterctl nodes --state x` is
    `clusterctl nodes list --state x`."""
    argv = list(argv)
    i = 0
    while i < len(argv):
        if argv[i] in GLOBAL_OPTIONS_WITH_VALUES:
            i += 2
        elif argv[i].startswith("-"):
            i += 1
        else:  # the noun
            if i + 1 == len(argv) or argv[i + 1].startswith("-"):
                argv.insert(i + 1, "list")
            break
    return argv


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(with_list_by_default(argv))
    try:
        if not args.url:
            raise ApiError("no console: set CLUSTERCTL_URL (or --url)")
        data, kind = run(Api(args.url, read_token(os.environ)), args)
    except ApiError as exc:
        print(f"clusterctl: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(data, indent=2) if args.json else table(data, COLUMNS[kind]))
    return 0
