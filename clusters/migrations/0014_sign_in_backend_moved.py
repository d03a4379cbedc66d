"""The OpenID Connect backend moved with the cluster's code from clusterui.oidc to
clusters.oidc. A session remembers the path of the backend that signed its user in, and
Django signs out a session whose path is not in AUTHENTICATION_BACKENDS: rewrite the path in
the stored sessions so that people stay signed in across the upgrade."""

from django.conf import settings
from django.contrib.sessions.backends.db import SessionStore
from django.db import migrations

OLD_BACKEND = "clusterui.oidc.OIDCBackend"
NEW_BACKEND = "clusters.oidc.OIDCBackend"


def rename_backend(apps, schema_editor, old=OLD_BACKEND, new=NEW_BACKEND):
    if settings.SESSION_ENGINE != "django.contrib.sessions.backends.db":
        return  # sessions kept elsewhere (a cache, signed cookies): none stored here
    store = SessionStore()
    Session = apps.get_model("sessions", "Session")
    for session in Session.objects.filter(session_data__isnull=False).iterator():
        data = store.decode(session.session_data)
        if data.get("_auth_user_backend") == old:
            data["_auth_user_backend"] = new
            session.session_data = store.encode(data)
            session.save(update_fields=["session_data"])


def rename_backend_back(apps, schema_editor):
    rename_backend(apps, schema_editor, old=NEW_BACKEND, new=OLD_BACKEND)


class Migration(migrations.Migration):
    dependencies = [
        ("clusterui", "0013_cluster_degraded_threshold_pct"),
        ("sessions", "0001_initial"),
    ]

    operations = [migrations.RunPython(rename_backend, rename_backend_back)]
