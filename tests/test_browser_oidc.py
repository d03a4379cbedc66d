"""In Chromium, through a real OpenID Connect provider (tests/oidc/provider.mjs, the npm
package oidc-provider): people sign in on the provider's own login form, get the role their
IdP groups map to, are refused when no group maps, and sign out here and at the provider.
An htmx request whose session has expired or is due for renewal goes by the provider and
comes back to the page.

The console is a daphne with CLUSTERUI_OIDC_* pointing at the provider (`oidc_daphne_server`).
No Celery worker runs: an approved repair stays at its first step."""

from urllib.parse import urlsplit

import pytest
from django.contrib.auth import get_user_model
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session
from playwright.sync_api import expect

from clusters.models import AuditEntry, Identity
from clusters.roles import Role, role_of
from clusters.tests.factories import ClusterFactory
from healthchecks.services import do_record_health_event
from nodes.tests.factories import GpuFactory, NodeFactory
from repairs.choices import Status
from repairs.models import Repair
from repairs.services import refresh_recommendation

from .browser import assert_no_csp_violations, in_a_thread, screenshot
from .oidc.provider import PASSWORDS

pytestmark = [pytest.mark.browser, pytest.mark.integration,
              pytest.mark.django_db(transaction=True)]

User = get_user_model()


@pytest.fixture
def console(oidc_page, request):
    return request.node.console_log


def a_proposed_reboot(node):
    gpu = GpuFactory(node=node, index=3)
    do_record_health_event(node, signature="xid:79", severity="critical", gpu=gpu,
                           message="GPU has fallen off the bus")
    return refresh_recommendation(node)


@pytest.fixture
def repair(transactional_db):
    cluster = ClusterFactory(name="oidc-h200", slug="oidc-h200")
    node = NodeFactory(cluster=cluster, name="gpu-021")
    return in_a_thread(a_proposed_reboot, node)


def repair_tab(repair):
    return f"/c/{repair.node.cluster.slug}/repair/"


def sign_in_at_provider(page, provider, login, screenshot_name=None):
    """On the provider's login form (where the console sent the browser), sign in."""
    assert page.url.startswith(f"{provider.issuer}/interaction/"), page.url
    expect(page.locator("h1")).to_have_text("Test identity provider")
    if screenshot_name:
        screenshot(page, screenshot_name)
    page.fill("#idp-username", login)
    page.fill("#idp-password", PASSWORDS[login])
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{provider.console_url}/**")


def session_key(page):
    return next(c["value"] for c in page.context.cookies() if c["name"] == "sessionid")


def test_an_operator_signs_in_at_the_provider_and_approves_a_repair(
        oidc_page, oidc_provider, console, repair):
    page = oidc_page
    tab = repair_tab(repair)
    page.goto(tab)
    sign_in_at_provider(page, oidc_provider, "olivia", "oidc-provider-login")
    assert urlsplit(page.url).path == tab
    expect(page.locator(".who")).to_have_text("olivia (operator)")

    card = page.locator(f"#repair-{repair.public_id}")
    card.get_by_role("button", name="Approve").click()
    running = page.locator("#repair-running").locator(f"#repair-{repair.public_id}")
    expect(running).to_contain_text("approved by olivia")
    screenshot(page, "oidc-operator-approved")

    olivia = User.objects.get(username="olivia")
    assert role_of(olivia) == Role.OPERATOR
    assert (olivia.email, olivia.get_full_name()) == ("olivia@example.com", "Olivia Operator")
    identity = Identity.objects.get(user=olivia)
    assert identity.issuer == oidc_provider.issuer and identity.sub != "olivia"
    assert Repair.objects.get(pk=repair.pk).reviewed_by == olivia
    sign_in = AuditEntry.objects.get(action="user.sign_in", actor=olivia)
    assert sign_in.changes["groups"] == ["platform-oncall", "everyone"]
    assert sign_in.changes["role"] == {"before": None, "after": "operator"}
    assert not console.errors, str(console)
    assert_no_csp_violations(console)


def test_a_viewer_has_no_approve_button_and_a_forged_approval_is_refused(
        oidc_page, oidc_provider, console, repair):
    page = oidc_page
    tab = repair_tab(repair)
    page.goto(tab)
    sign_in_at_provider(page, oidc_provider, "victor")
    expect(page.locator(".who")).to_have_text("victor (viewer)")
    card = page.locator(f"#repair-{repair.public_id}")
    expect(card).to_contain_text("gpu-021")
    expect(card.get_by_role("button", name="Approve")).to_have_count(0)
    screenshot(page, "oidc-viewer-repair-tab")

    # The POST the button would make, with the viewer's session and a valid CSRF token.
    csrf_token = page.evaluate(
        "JSON.parse(document.body.getAttribute('hx-headers'))['X-CSRFToken']")
    response = page.request.post(f"{tab}{repair.public_id}/approve/",
                                 headers={"X-CSRFToken": csrf_token, "HX-Request": "true"},
                                 form={"comment": "forged"})
    assert response.status == 403
    assert "This needs the operator role" in response.text()
    assert Repair.objects.get(pk=repair.pk).status == Status.PROPOSED
    assert not console.errors, str(console)


def test_someone_in_no_mapped_group_is_refused_with_a_page_that_says_why(
        oidc_page, oidc_provider, console):
    page = oidc_page
    page.goto("/")
    sign_in_at_provider(page, oidc_provider, "nora")
    assert urlsplit(page.url).path == "/accounts/sign-in-failed/"
    expect(page.locator("h1")).to_have_text("No access to clusterui")
    expect(page.locator("main")).to_contain_text("signed you in as nora@example.com")
    expect(page.locator("#groups-seen")).to_have_text("no groups")
    expect(page.locator("#mapped-groups")).to_contain_text("operator platform-oncall")
    expect(page.locator("#mapped-groups")).to_contain_text("viewer ml-engineers, researchers")
    screenshot(page, "oidc-refused")
    assert not User.objects.filter(email="nora@example.com").exists()

    # Not a loop: the console sends her to the provider, which knows her, and back here.
    page.goto("/")
    page.wait_for_url("**/accounts/sign-in-failed/")
    expect(page.locator("h1")).to_have_text("No access to clusterui")
    assert_no_csp_violations(console)


def test_sign_out_ends_the_session_here_and_at_the_provider(oidc_page, oidc_provider, console):
    page = oidc_page
    page.goto("/")
    sign_in_at_provider(page, oidc_provider, "olivia")
    expect(page.locator(".who")).to_have_text("olivia (operator)")

    # While the provider's session lasts, a new console session needs no password there.
    page.context.clear_cookies(name="sessionid")
    page.goto("/")
    page.wait_for_url(f"{oidc_provider.console_url}/**")
    expect(page.locator(".who")).to_have_text("olivia (operator)")
    signed_in_session = session_key(page)
    assert Session.objects.filter(session_key=signed_in_session).exists()

    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url("**/accounts/signed-out/")
    expect(page.locator("h1")).to_have_text("You have signed out")
    screenshot(page, "oidc-signed-out")
    assert not Session.objects.filter(session_key=signed_in_session).exists()
    sign_out = AuditEntry.objects.get(action="user.sign_out")
    assert sign_out.actor.username == "olivia" and sign_out.changes["at_provider"] is True

    # Signing in again asks for the password: the provider's session has ended too.
    page.get_by_role("link", name="Sign in again").click()
    page.wait_for_url(f"{oidc_provider.issuer}/interaction/**")
    expect(page.locator("#idp-password")).to_be_visible()
    sign_in_at_provider(page, oidc_provider, "olivia")
    expect(page.locator(".who")).to_have_text("olivia (operator)")
    assert not console.errors, str(console)


def navigations_of(page):
    """The URLs the page's navigations ask for from now on, each redirect's target too."""
    urls = []
    page.on("request", lambda request: urls.append(request.url)
            if request.is_navigation_request() and request.frame == page.main_frame else None)
    return urls


def htmx_get(page, path):
    page.evaluate("path => htmx.ajax('GET', path, {target: 'main', swap: 'none'})", path)


def test_an_htmx_request_after_the_session_ended_signs_in_again_and_comes_back(
        oidc_page, oidc_provider, console, repair):
    page = oidc_page
    tab = repair_tab(repair)
    page.goto(tab)
    sign_in_at_provider(page, oidc_provider, "olivia")
    Session.objects.filter(session_key=session_key(page)).delete()
    urls = navigations_of(page)

    with page.expect_navigation():
        htmx_get(page, tab)
    expect(page.locator(".who")).to_have_text("olivia (operator)")
    assert urlsplit(page.url).path == tab
    # The browser itself went to the sign-in page (HX-Redirect) and by the provider, which
    # still knew olivia and sent her back without its form.
    assert urlsplit(urls[0]).path == "/accounts/login/", urls
    assert any(u.startswith(f"{oidc_provider.issuer}/auth") for u in urls), urls
    assert not any("/interaction/" in u for u in urls), urls
    assert not console.errors, str(console)


def test_an_htmx_request_due_for_renewal_is_renewed_by_the_provider(
        oidc_page, oidc_provider, console, repair):
    page = oidc_page
    tab = repair_tab(repair)
    page.goto(tab)
    sign_in_at_provider(page, oidc_provider, "olivia")
    key = session_key(page)
    session = SessionStore(session_key=key)
    session["oidc_id_token_expiration"] = 0
    session.save()
    urls = navigations_of(page)

    with page.expect_navigation():
        htmx_get(page, tab)
    expect(page.locator(".who")).to_have_text("olivia (operator)")
    assert urlsplit(page.url).path == tab
    assert session_key(page) == key  # renewed, not signed in anew
    assert SessionStore(session_key=key)["oidc_id_token_expiration"] > 0
    # HX-Redirect to the sign-in page, which (still signed in) sends the browser back to the
    # page, whose plain GET goes by the provider without a prompt.
    assert urlsplit(urls[0]).path == "/accounts/login/", urls
    assert any(u.startswith(f"{oidc_provider.issuer}/auth") and "prompt=none" in u
               for u in urls), urls
    assert not any("/interaction/" in u for u in urls), urls
    assert not console.errors, str(console)
