"""Nodes: Node and its GPUs, the node state function (states.py) over facts on the node
(higher apps hand theirs down), work for agents (agent_work.py), agent commands, the live
store and rollups. Adapters: the agent gateway (protocol, consumers, ingest), the publisher
(the only thing that pushes to browsers and agents, from the change feed), /metrics; the
Nodes tab and node pages. Imports clusterui and common only, but for its adapters and pages."""
