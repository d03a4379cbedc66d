"""The audit trail is append-only: no change or delete through the model, a queryset or the
Django admin."""

import pytest
from django.conf import settings
from django.urls import get_resolver

from clusters.models import AuditEntry
from clusters.services import record_audit

pytestmark = pytest.mark.django_db


@pytest.fixture
def entry(cluster, admin):
    return record_audit(admin, "cluster.update", cluster, cluster=cluster,
                        changes={"region": {"before": "us-west-2", "after": "eu-north-1"}})


def test_an_entry_cannot_be_saved_again(entry):
    entry.action = "cluster.create"
    with pytest.raises(ValueError, match="append-only"):
        entry.save()
    assert AuditEntry.objects.get().action == "cluster.update"


def test_an_entry_cannot_be_deleted(entry):
    with pytest.raises(ValueError, match="append-only"):
        entry.delete()
    assert AuditEntry.objects.count() == 1


def test_entries_cannot_be_updated_or_deleted_in_bulk(entry):
    with pytest.raises(ValueError, match="append-only"):
        AuditEntry.objects.filter(pk=entry.pk).update(action="cluster.create")
    with pytest.raises(ValueError, match="append-only"):
        AuditEntry.objects.all().delete()
    assert AuditEntry.objects.get().action == "cluster.update"


def test_deleting_the_actor_or_the_cluster_keeps_the_entry(entry, admin, cluster):
    admin.delete()
    cluster.delete()
    kept = AuditEntry.objects.get()
    assert (kept.actor, kept.cluster, kept.actor_name) == (None, None, "ada")
    assert kept.object_repr == "prod-h200" and kept.changes["region"]["after"] == "eu-north-1"


def test_the_django_admin_is_not_mounted():
    """Its change and delete views would edit the trail. Whoever mounts it registers AuditEntry
    read-only (no add, change or delete permission) and tests that instead."""
    assert "django.contrib.admin" not in settings.INSTALLED_APPS
    prefixes = [str(p.pattern) for p in get_resolver().url_patterns]
    assert not any(prefix.startswith("admin") for prefix in prefixes), prefixes
