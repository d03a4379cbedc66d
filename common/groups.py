"""Channel-layer group names. Only the publisher and the consumers touch the channel layer;
both take the names from here."""


def cluster_group(slug):
    """The browsers showing a cluster's pages."""
    return f"cluster.{slug}"


def agent_group(node_id):
    """The connection of a node's agent (at most one, wherever it is served)."""
    return f"agent.node.{node_id}"
