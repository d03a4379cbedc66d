"""Pages that compose several apps (layer 2): the cluster list (nodes by state), creating a
cluster, the overview (states, usage, the timeline) and the cluster's settings page (its
configuration, join tokens and re-join)."""
