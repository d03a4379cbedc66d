"""Health (layer 5): HealthEvent, the signature catalog (signatures.py), the Xid catalog
(xid_catalog.py) and the check catalog (check_catalog.py); the passive rules (agent events,
heartbeats.py, slow GPUs, the GPU inventory rule gpu_lost.py); active checks and acceptance
(check runs are agent work; services/check_runs.py); the Health checks tab, and health's
sections of the Nodes pages (templatetags/health.py). Hands each node its health facts
(services/facts.py); every event change is a row of the change feed."""
