"""Password guessing is limited on the local sign-in form and on break-glass: an account name
tried from one address, or an address over all names, is locked for the window after too
many refusals; while locked nothing is checked (the right password gets in no sooner) and
nothing is written, the person is told until when (429), and the audit trail has one row
for the lockout. Another address still gets in; behind a proxy, the address is the one the
trusted proxies saw, not one the client wrote."""

import ipaddress
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from clusters.models import AuditEntry, FailedSignIn
from clusters.roles import Role
from clusters.sign_in_limits import lockout, record_failed_sign_in
from clusters.tests.factories import UserFactory

pytestmark = pytest.mark.django_db

FORMS = {"local": ("/accounts/login/", "user.sign_in_refused"),
         "break-glass": ("/accounts/break-glass/", "user.break_glass_sign_in")}


@pytest.fixture(autouse=True)
def limits(settings):
    settings.CLUSTERUI_SIGN_IN_MAX_FAILURES = 3
    settings.CLUSTERUI_SIGN_IN_MAX_FAILURES_PER_ADDRESS = 5
    settings.CLUSTERUI_SIGN_IN_LOCKOUT_S = 600


@pytest.fixture
def root(db):
    return UserFactory(username="root", role=Role.ADMIN)


def sign_in(client, form, username, password):
    url, _ = FORMS[form]
    return client.post(url, {"username": username, "password": password})


def signed_in(client):
    return "_auth_user_id" in client.session


@pytest.mark.parametrize("form", FORMS)
def test_after_the_limit_even_the_right_password_is_refused_and_the_lockout_audited_once(
        client, root, form):
    for _ in range(3):
        assert sign_in(client, form, "root", "guess").status_code == 200
    rows_when_locked = AuditEntry.objects.count()
    for _ in range(10):
        response = sign_in(client, form, "root", "password")
        assert response.status_code == 429
        assert "Too many failed sign-ins; try again after" in response.text
    assert not signed_in(client)
    _, action = FORMS[form]
    assert AuditEntry.objects.filter(action=action).count() == 3  # the three passwords refused
    [locked] = AuditEntry.objects.filter(action="user.sign_in_locked_out")
    assert locked.changes["reason"] == "too many failed sign-ins for this account from this address"
    assert locked.changes["username"] == "root" and locked.changes["form"] == action
    assert locked.actor is None and locked.source_ip == "127.0.0.1"
    # Refusals while locked write nothing, and do not count: the lock ends with the window
    # of the first three.
    assert AuditEntry.objects.count() == rows_when_locked
    assert FailedSignIn.objects.count() == 3


@pytest.mark.parametrize("form", FORMS)
def test_the_account_is_not_locked_for_another_address(root, form):
    attacker = Client(REMOTE_ADDR="203.0.113.9")
    for _ in range(4):
        sign_in(attacker, form, "root", "guess")
    admin = Client(REMOTE_ADDR="10.0.0.7")
    assert sign_in(admin, form, "root", "password").status_code == 302
    assert signed_in(admin)


def test_an_address_trying_many_names_is_locked(client, root):
    for name in ["a", "b", "c", "d", "e"]:
        sign_in(client, "break-glass", name, "guess")
    response = sign_in(client, "break-glass", "root", "password")
    assert response.status_code == 429 and not signed_in(client)
    [locked] = AuditEntry.objects.filter(action="user.sign_in_locked_out")
    assert locked.changes["reason"] == "too many failed sign-ins from this address"


def test_the_lock_ends_when_the_oldest_refusal_leaves_the_window(root):
    now = timezone.now()
    for seconds in (0, 60, 120):
        record_failed_sign_in("root", "127.0.0.1", now=now + timedelta(seconds=seconds))
    locked = lockout("root", "127.0.0.1", now=now + timedelta(seconds=130))
    assert locked.until == now + timedelta(seconds=600)
    assert lockout("root", "127.0.0.1", now=now + timedelta(seconds=599)) is not None
    assert lockout("root", "127.0.0.1", now=now + timedelta(seconds=601)) is None


def test_names_are_counted_without_case(root):
    for name in ["root", "ROOT", "Root"]:
        record_failed_sign_in(name, "127.0.0.1")
    assert lockout("rOOt", "127.0.0.1") is not None


def test_a_successful_sign_in_starts_the_count_again(client, root):
    for _ in range(2):
        sign_in(client, "local", "root", "guess")
    assert sign_in(client, "local", "root", "password").status_code == 302
    client.post("/accounts/logout/")
    for _ in range(2):
        sign_in(client, "local", "root", "guess")
    assert sign_in(client, "local", "root", "password").status_code == 302


def test_old_refusals_are_deleted_as_new_ones_come(root):
    now = timezone.now()
    record_failed_sign_in("root", "127.0.0.1", now=now - timedelta(hours=1))
    record_failed_sign_in("root", "127.0.0.1", now=now)
    assert list(FailedSignIn.objects.values_list("at", flat=True)) == [now]


def test_a_refused_local_sign_in_is_audited_with_the_name_tried(client):
    sign_in(client, "local", "nobody", "guess")
    entry = AuditEntry.objects.get(action="user.sign_in_refused")
    assert entry.actor is None and entry.object_repr == "nobody"
    assert entry.changes == {"method": "password", "outcome": "refused",
                             "reason": "wrong user name or password", "username": "nobody"}


@pytest.fixture
def behind_a_proxy(settings):
    settings.CLUSTERUI_TRUSTED_PROXIES = (ipaddress.ip_network("10.0.0.0/8"),)
    return Client(REMOTE_ADDR="10.0.0.2")


def test_behind_a_trusted_proxy_a_forged_forwarded_for_does_not_dodge_the_limit(
        behind_a_proxy, root):
    # The attacker writes a new X-Forwarded-For each time; the proxy appends the address it
    # got the request from.
    for i in range(3):
        sign_in_through(behind_a_proxy, f"198.51.100.{i}, 203.0.113.9", "guess")
    response = sign_in_through(behind_a_proxy, "192.0.2.77, 203.0.113.9", "password")
    assert response.status_code == 429
    assert set(FailedSignIn.objects.values_list("source_ip", flat=True)) == {"203.0.113.9"}
    [locked] = AuditEntry.objects.filter(action="user.sign_in_locked_out")
    assert locked.source_ip == "203.0.113.9"
    # Another person behind the same proxy is not locked out.
    assert sign_in_through(behind_a_proxy, "203.0.113.10", "password").status_code == 302


def sign_in_through(client, forwarded_for, password):
    return client.post("/accounts/login/", {"username": "root", "password": password},
                       HTTP_X_FORWARDED_FOR=forwarded_for)
