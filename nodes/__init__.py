"""Nodes (layer 6): Node and its GPUs, the node state function (states.py) over facts on
the node (higher apps hand theirs down), the live store (live_store.py) and rollups, work
for agents (agent_work.py) and agent commands, maintenance windows, agent and join tokens,
and the Nodes pages. Health's and repairs' sections of those pages are drawn by their own
apps' template tags, so nodes imports neither."""
