"""Repairs: recommendations (services.py, policy.py; the recommender reads the change feed),
the state machine (transitions.py, which hands a node its running repair), the steps
(steps.py) through the cluster's scheduler (schedulers/) and the machine providers
(providers.py), the Repair tab."""
