from django.apps import AppConfig
from django.db.models.signals import post_migrate


class ClustersConfig(AppConfig):
    name = "clusters"
    # The app label from before clusters/ had a package of its own: its tables, migration
    # history, the other apps' migration dependencies and the audit trail's object types
    # ("clusterui.cluster") all keep it.
    label = "clusterui"
    verbose_name = "clusters"

    def ready(self):
        from .oidc import role_groups
        from .roles import ensure_role_groups

        # A malformed CLUSTERUI_OIDC_ROLE_GROUPS stops start-up, naming the mistake.
        role_groups()

        # Groups and permissions are infrastructure, refreshed after every migrate (any app:
        # the permissions of apps migrated after this one exist only then).
        post_migrate.connect(ensure_role_groups)
