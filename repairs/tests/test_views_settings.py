"""Repair settings and the policy table: admins change them (audited), everyone else reads
them; provider commands are validated; each row shows the default it overrides."""

import pytest
from django.urls import reverse

from clusters.models import AuditEntry, Cluster
from repairs.models import RepairPolicy, RepairSettings
from repairs.services import DEFAULT_DRAIN_FIELDS

pytestmark = pytest.mark.django_db

VALID = {"provider": "command", "blast_radius_pct": "20",
         "boot_timeout_s": "1200",
         "reprovision_command": "maas admin machine deploy {hostname}",
         "failover_command": "", "remove_command": "ipmitool -H {hostname}-bmc chassis power off",
         "window_mode": "record_only", "window_action": "remove", "xid_window_count": 5,
         "xid_window_hours": 24, "repair_window_count": 5, "repair_window_days": 7}


@pytest.fixture
def url(cluster):
    return reverse("repairs:settings", args=[cluster.slug])


@pytest.fixture
def policy_url(cluster):
    return reverse("repairs:policy", args=[cluster.slug])


def test_an_admin_saves_the_settings_and_it_is_audited(client_for, admin, cluster, url):
    response = client_for(admin).post(url, VALID, follow=True)

    assert response.redirect_chain == [(url, 302)]
    stored = RepairSettings.objects.get(cluster=cluster)
    assert (stored.blast_radius_pct, stored.boot_timeout_s) == (20, 1200)
    assert stored.provider_commands == {
        "reprovision": "maas admin machine deploy {hostname}",
        "remove": "ipmitool -H {hostname}-bmc chassis power off"}
    entry = AuditEntry.objects.get(action="repairsettings.update")
    assert entry.actor == admin and entry.cluster == cluster
    assert entry.changes["blast_radius_pct"] == {"before": 10, "after": 20}
    assert entry.changes["provider_commands"]["before"] == {}
    assert "failover" not in entry.changes["provider_commands"]["after"]
    assert "Saved:" in response.text and "blast_radius_pct" in response.text

    again = client_for(admin).post(url, VALID, follow=True)
    assert "Nothing changed." in again.text
    assert AuditEntry.objects.count() == 1


@pytest.mark.parametrize("field,value,error", [
    ("reprovision_command", "maas deploy {nodes}", "Unknown placeholder {nodes}"),
    ("remove_command", "awk '{print $1}'", "Unknown placeholder"),
    ("failover_command", "echo {node!r}", "without a conversion"),
    ("blast_radius_pct", "0", "greater than or equal to 1"),
    ("blast_radius_pct", "101", "less than or equal to 100"),
])
def test_invalid_settings_are_refused(client_for, admin, cluster, url, field, value, error):
    response = client_for(admin).post(url, {**VALID, field: value})
    assert response.status_code == 400
    assert error in response.text
    assert not AuditEntry.objects.exists()
    assert RepairSettings.objects.get(cluster=cluster).blast_radius_pct == 10


def test_viewers_read_the_settings_without_the_commands(client_for, admin, viewer, cluster,
                                                        url):
    Cluster.objects.filter(pk=cluster.pk).update(scheduler="slurm",
                                                 scheduler_config="/etc/slurm/slurm.conf")
    client_for(admin).post(url, VALID)
    text = client_for(viewer).get(url).text
    assert "Slurm" in text and "/etc/slurm/slurm.conf" in text and "20 %" in text
    assert "reprovision: configured" in text
    assert "record only" in text and "5 fatal Xids on one GPU within 24 h" in text
    assert 'failover: <span class="muted">not configured' in text
    assert "maas admin" not in text and "ipmitool" not in text  # they may hold credentials
    assert 'name="scheduler"' not in text and 'name="action"' not in text
    assert "xid:79" in text  # the policy table, read-only


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_only_admins_change_settings(client_for, role, request, url, policy_url):
    client = client_for(request.getfixturevalue(role))
    assert client.post(url, VALID).status_code == 403
    assert client.post(policy_url, {"signature": "xid:79", "action": "none"}).status_code == 403
    assert not AuditEntry.objects.exists() and not RepairPolicy.objects.exists()


def test_users_without_a_role_cannot_read_them(client_for, outsider, url):
    assert client_for(outsider).get(url).status_code == 403


def rows_by_signature(response):
    return {row.signature: row for row in response.context["policy_rows"]}


def test_the_policy_table_shows_each_default(client_for, viewer, url):
    rows = rows_by_signature(client_for(viewer).get(url))
    assert rows["xid:79"].default.actions == ("reboot", "reprovision", "failover", "remove")
    assert rows["xid:54"].default.actions == ("remove",)  # CHECK_MECHANICALS applies to H200
    assert rows["gpu_lost"].default.actions[0] == "reboot"
    assert rows["row_remap_failure"].default.actions == ("remove",)
    assert rows["thermal_throttle"].default.actions == ("failover",)
    assert "only once it has lasted 15 minutes" in rows["thermal_throttle"].default.lighter
    assert rows["check:gpu_compute"].default.actions[0] == "reboot"
    assert rows["job_leftovers"].default.actions == ("cleanup", "reset_gpu", "reboot")
    assert rows["zombie_processes"].default.actions == ("cleanup",)
    assert "xid:31" not in rows  # no default repair: listed once a row overrides it
    assert all(row.override is None for row in rows.values())


def test_an_admin_overrides_a_signature_and_goes_back_to_the_default(client_for, admin,
                                                                     cluster, url, policy_url):
    client = client_for(admin)

    client.post(policy_url, {"signature": "xid:79", "action": "reprovision",
                             "auto_approve": "on"})
    row = RepairPolicy.objects.get(cluster=cluster, signature="xid:79")
    assert (row.action, row.auto_approve, row.updated_by) == ("reprovision", True, admin)
    entry = AuditEntry.objects.get(action="repairpolicy.update")
    assert entry.changes == {"signature": "xid:79", "before": None,
                             "after": {"action": "reprovision", "auto_approve": True,
                                       **DEFAULT_DRAIN_FIELDS}}
    shown = rows_by_signature(client.get(url))["xid:79"]
    assert shown.override == row and shown.default.actions[0] == "reboot"

    client.post(policy_url, {"signature": "xid:31", "action": "none"})
    assert RepairPolicy.objects.get(signature="xid:31").action == ""
    assert "xid:31" in rows_by_signature(client.get(url))

    response = client.post(policy_url, {"signature": "xid:79", "action": "default"},
                           follow=True)
    assert not RepairPolicy.objects.filter(signature="xid:79").exists()
    assert AuditEntry.objects.get(action="repairpolicy.delete").changes["before"] == {
        "action": "reprovision", "auto_approve": True, **DEFAULT_DRAIN_FIELDS}
    assert "Policy for xid:79 saved." in response.text


def test_auto_approve_needs_an_action(client_for, admin, policy_url):
    for action in ("default", "none"):
        response = client_for(admin).post(policy_url, {"signature": "xid:79", "action": action,
                                                       "auto_approve": "on"})
        assert response.status_code == 400
        assert "Auto-approve needs an action" in response.text
    assert not RepairPolicy.objects.exists()


def test_a_signature_must_look_like_one(client_for, admin, policy_url):
    response = client_for(admin).post(policy_url, {"signature": "xid 79; drop", "action": "none"})
    assert response.status_code == 400 and "is not a signature" in response.text
    assert not RepairPolicy.objects.exists()


def test_the_policy_endpoint_refuses_get(client_for, admin, policy_url):
    assert client_for(admin).get(policy_url).status_code == 405


def test_the_settings_page_warns_about_auto_approve(client_for, admin, url):
    text = client_for(admin).get(url).text
    assert "Auto-approve is off unless turned on here" in text


def test_the_policy_table_shows_how_operators_decided_each_signature(client_for, viewer,
                                                                   cluster, url, operator):
    from repairs.choices import Status
    from repairs.tests.factories import RepairFactory

    for status, auto in ((Status.SUCCEEDED, False), (Status.SUCCEEDED, True),
                         (Status.REJECTED, False), (Status.REJECTED, False),
                         (Status.RESOLVED, False), (Status.PROPOSED, False)):
        RepairFactory(node__cluster=cluster, signature="xid:79", status=status,
                      auto_approved=auto)
    RepairFactory(node__cluster=cluster, signature="xid:79", status=Status.REJECTED,
                  requested_by=operator)  # proposed by a person: not the system's
    rows = rows_by_signature(client_for(viewer).get(url))
    decided = rows["xid:79"].decisions
    assert (decided.made, decided.approved, decided.auto_approved, decided.rejected,
            decided.resolved, decided.pending) == (6, 1, 1, 2, 1, 1)
    assert rows["gpu_lost"].decisions.made == 0
    page = client_for(viewer).get(url).text
    assert ("6 recommended: 1 approved, 1 auto-approved, 2 rejected, 1 resolved by "
            "themselves, 1 pending") in page
