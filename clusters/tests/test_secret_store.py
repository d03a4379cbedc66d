"""The secrets store (issue 15, point 8): values encrypted at rest under keys from the
settings (MultiFernet: rotation), set and replaced by admins and never shown back, every
change audited without the value, handed to what names them as $NAME and masked in what
that prints."""

import stat

import pytest
from cryptography.fernet import Fernet
from django.urls import reverse

from clusters.models import AuditEntry, Secret
from clusters.roles import Role
from clusters.secret_store import (
    SecretsUnavailable,
    do_set_secret,
    masked,
    referenced_names,
    rotate_all,
    values_referenced_in,
)
from clusters.tests.factories import UserFactory

pytestmark = pytest.mark.django_db

VALUE = "correct horse battery staple"


@pytest.fixture
def key(settings):
    settings.CLUSTERUI_SECRETS_KEYS = [Fernet.generate_key().decode()]
    return settings.CLUSTERUI_SECRETS_KEYS[0]


def test_a_value_is_encrypted_at_rest_and_opened_for_what_names_it(key, admin):
    do_set_secret("IPMI_PASSWORD", VALUE, actor=admin, description="BMCs of rack 4")
    stored = Secret.objects.get()
    assert VALUE not in stored.ciphertext and stored.ciphertext.startswith("gAAAA")
    assert values_referenced_in('ipmitool -P "$IPMI_PASSWORD" power cycle') == {
        "IPMI_PASSWORD": VALUE}
    assert values_referenced_in("echo ${IPMI_PASSWORD}") == {"IPMI_PASSWORD": VALUE}
    assert values_referenced_in("echo $HOME $OTHER") == {}  # not secrets: the shell's


def test_replacing_a_value_is_audited_and_no_audit_row_holds_a_value(key, admin):
    do_set_secret("TOKEN", "first-value", actor=admin)
    do_set_secret("TOKEN", "second-value", actor=admin, description="rotated")
    assert values_referenced_in("$TOKEN") == {"TOKEN": "second-value"}
    entries = list(AuditEntry.objects.filter(object_type="clusterui.secret").order_by("id"))
    assert [e.action for e in entries] == ["secret.create", "secret.replace"]
    assert all("value" not in str(e.changes) for e in entries)
    assert entries[1].changes == {"name": "TOKEN", "description": "rotated"}


def test_a_new_key_goes_first_the_values_are_rotated_then_the_old_key_goes(settings, admin):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.CLUSTERUI_SECRETS_KEYS = [old]
    do_set_secret("TOKEN", VALUE, actor=admin)
    settings.CLUSTERUI_SECRETS_KEYS = [new, old]
    assert values_referenced_in("$TOKEN") == {"TOKEN": VALUE}
    assert rotate_all() == 1
    settings.CLUSTERUI_SECRETS_KEYS = [new]
    assert values_referenced_in("$TOKEN") == {"TOKEN": VALUE}
    settings.CLUSTERUI_SECRETS_KEYS = [Fernet.generate_key().decode()]
    with pytest.raises(SecretsUnavailable, match="does not open"):
        values_referenced_in("$TOKEN")


def test_without_a_key_nothing_is_stored_and_embedded_mode_makes_one(settings, tmp_path,
                                                                    admin):
    settings.CLUSTERUI_SECRETS_KEYS = []
    settings.CLUSTERUI_SECRETS_KEY_FILE = None
    with pytest.raises(SecretsUnavailable, match="CLUSTERUI_SECRETS_KEYS"):
        do_set_secret("TOKEN", VALUE, actor=admin)
    assert not Secret.objects.exists()
    settings.CLUSTERUI_SECRETS_KEY_FILE = tmp_path / "secrets.key"
    do_set_secret("TOKEN", VALUE, actor=admin)
    assert stat.S_IMODE((tmp_path / "secrets.key").stat().st_mode) == 0o600
    assert values_referenced_in("$TOKEN") == {"TOKEN": VALUE}  # the same key, read again


def test_names_are_read_as_the_shell_reads_them():
    assert referenced_names("$A ${B_2} $lower $$ ${C ${D}x $9 E") == {"A", "B_2", "D"}


def test_values_are_masked_longest_first():
    assert masked("pw=abcdef and abc", {"LONG": "abcdef", "SHORT": "abc"}) == (
        "pw=<secret LONG> and <secret SHORT>")


def test_an_admin_sets_a_secret_on_the_page_and_never_sees_its_value(key, client_for, admin):
    client = client_for(admin)
    response = client.post(reverse("clusterui:secrets"), {
        "name": "BMC_PASSWORD", "value": VALUE, "description": "BMCs"})
    assert response.status_code == 302
    page = client.get(reverse("clusterui:secrets")).content.decode()
    assert "BMC_PASSWORD" in page and "BMCs" in page and VALUE not in page
    assert 'type="password"' in page


@pytest.mark.parametrize("name", ["lower", "1ST", "WITH-DASH", "A" * 65, ""])
def test_a_name_that_is_no_environment_variable_is_refused(key, client_for, admin, name):
    response = client_for(admin).post(reverse("clusterui:secrets"),
                                      {"name": name, "value": VALUE})
    assert response.status_code == 400 and not Secret.objects.exists()


@pytest.mark.parametrize("role", [Role.VIEWER, Role.OPERATOR])
def test_nobody_but_admins_sees_the_secrets_page(key, client_for, role, admin):
    do_set_secret("TOKEN", VALUE, actor=admin)
    user = UserFactory(username=f"u-{role}", role=role)
    assert client_for(user).get(reverse("clusterui:secrets")).status_code == 403
