"""clusterctl: clusterui's JSON API from a shell (README.md)."""
