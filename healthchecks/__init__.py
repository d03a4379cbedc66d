"""Health: HealthEvent and the Xid catalog, the passive rules (agent events, heartbeats,
slow GPUs, the GPU inventory), active checks and acceptance (check runs are agent work),
the Health checks tab. Hands each node its health facts (services.refresh_health_facts);
every event change is a row of the change feed. Below repairs, jobs and startup."""
