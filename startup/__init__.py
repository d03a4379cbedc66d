"""Startup scripts: versions, validation, delivery in the agent's config (an AGENT_CONFIG
change), their runs and the boot hold they put on a node; settings pages."""
