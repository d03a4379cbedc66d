"""The agent's connection to the server (shared/PROTOCOL.md):

    client.py      AgentClient: hello and welcome, samples, events, the server's frames,
                   reconnects with backoff
    protocol.py    the frames the agent sends, built and checked (event_frame & co.)
    outbox.py      the events kept on disk until the server acks them
    node_token.py  the node token the server issues at the first join, in the state dir

Importing this package imports nothing: the detectors and the Slurm hook use protocol.py
without websockets."""
