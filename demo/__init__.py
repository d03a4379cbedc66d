"""The demo (layer 2): `manage.py seed_demo` seeds a believable cluster with history, and
prepares the simulated agents of `make demo`. The one server package that may import the
agent (agent.sim: its boot-id file, fault schedule and H200 trace), since it drives both
sides."""
