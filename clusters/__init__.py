"""The cluster itself, at the bottom of the domain (layer 7 of DESIGN.md "Layout"):
Cluster, the audit trail (services.record_audit), the change feed every app appends to
(change_feed.py), roles, accounts and sign-in with its limits, OpenID Connect (oidc.py),
Kubernetes access (kubeaccess.py), the secret store (secret_store.py), and the pages that
read nothing above them: Kubernetes access, secrets, the audit trail.

Its app label is still "clusterui" (apps.py): the tables, migrations and audit object types
("clusterui.cluster") of the releases before this package keep their names."""
