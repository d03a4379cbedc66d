"""The agent's side of the server and the browsers' socket (layer 2, an adapter on top of
the domain): the agent WebSocket (consumers.py: thin, hands frames on), the protocol's frame
checks (protocol.py), per-connection frame limits (frame_limits.py), the database side of
ingest (ingest.py, event_batches.py), the publisher that pushes the live store and the change
feed to browsers and offers agent work (publisher.py), the browsers' live consumer
(live_consumers.py), the socket routes (routing.py) and Prometheus's /metrics (metrics.py)."""
