from django.apps import AppConfig
from django.db.models.signals import post_migrate


class ClusteruiConfig(AppConfig):
    name = "clusterui"
    verbose_name = "clusterui"

    def ready(self):
        from .roles import ensure_role_groups

        # Groups and permissions are infrastructure, refreshed after every migrate (any app:
        # the permissions of apps migrated after this one exist only then).
        post_migrate.connect(ensure_role_groups)
