"""The agent socket's own series, per server process (prometheus-client): how many agents it
serves, the hellos in hand, what it answered rate_limited, and how long an event waits for
its ack. A web process in embedded mode adds them to /metrics; a gateway process
(gateway/server.py) serves them at its own /metrics, which Prometheus scrapes per process."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

REGISTRY = CollectorRegistry(auto_describe=True)

AGENTS_CONNECTED = Gauge(
    "clusterui_gateway_agents_connected",
    "Agent connections this process serves (welcomed, not yet closed).", registry=REGISTRY)
HELLOS_IN_HAND = Gauge(
    "clusterui_gateway_hellos_in_hand",
    "Hellos this process is answering: all, and those on the full path (joins, reboots, a "
    "changed inventory).", ["path"], registry=REGISTRY)
AGENT_UPGRADES_WAITING = Gauge(
    "clusterui_gateway_agent_upgrades_waiting",
    "Agents' WebSocket upgrades waiting for a turn of a web process's event loop "
    "(gateway/daphne_upgrades.py).", registry=REGISTRY)
AGENT_UPGRADES_WAITED = Counter(
    "clusterui_gateway_agent_upgrades_waited",
    "Agents' WebSocket upgrades that waited for a later turn of a web process's event loop, "
    "behind others (gateway/daphne_upgrades.py).", registry=REGISTRY)
RATE_LIMITED = Counter(
    "clusterui_gateway_rate_limited",
    "Frames answered rate_limited, by what was refused (hello, event, frame).", ["refused"],
    registry=REGISTRY)
EVENT_ACK_SECONDS = Histogram(
    "clusterui_gateway_event_ack_seconds",
    "From an event frame's arrival to its ack (its batch stored).",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0), registry=REGISTRY)


def render_gateway_series():
    return generate_latest(REGISTRY).decode()
