from django.db import models


class NodeState(models.TextChoices):
    """The five node states, in DESIGN.md's precedence order (the first that holds wins)."""

    PAUSED = "paused", "paused"
    PENDING = "pending", "pending"
    BOOTING = "booting", "booting"
    UNHEALTHY = "unhealthy", "unhealthy"
    HEALTHY = "healthy", "healthy"


# One colour per state, everywhere (badges, tiles, charts). CSS classes use the state value.
STATE_COLOURS = {
    NodeState.HEALTHY: "#2e9e5b",
    NodeState.BOOTING: "#2f7fd1",
    NodeState.UNHEALTHY: "#d9433b",
    NodeState.PENDING: "#8a8f98",
    NodeState.PAUSED: "#d59a1c",
}

# The order the console lists states in: good news first, as operators read a cluster.
DISPLAY_ORDER = [
    NodeState.HEALTHY,
    NodeState.BOOTING,
    NodeState.UNHEALTHY,
    NodeState.PENDING,
    NodeState.PAUSED,
]

# The states a node serves no jobs in: what makes a cluster degraded (clusters.status).
OUT_OF_SERVICE = (NodeState.PAUSED, NodeState.UNHEALTHY)


class NodeRole(models.TextChoices):
    """What a node is for; it picks its startup scripts (startup/)."""

    WORKER = "worker", "worker"
    LOGIN = "login", "login"
    CONTROLLER = "controller", "controller"
