"""Fixtures for the browser tests: daphne against the test database, and a Chromium page.

A browser test asks for `page` (and `console` for what the page logged). `page` brings in
`transactional_db`: the test's rows are committed, so the daphne subprocess sees them, and
the tables are flushed after the test. Both need PostgreSQL, i.e. `make test`.
"""

import pytest

from .browser import (
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_ARGS,
    ConsoleLog,
    DaphneServer,
    database_url,
    screenshot,
    subprocess_env,
)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the item, so fixtures can tell that the test failed."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture(scope="session")
def daphne_server(django_db_setup):
    """daphne serving clusterui.asgi on a free loopback port, against the test database.

    Session-scoped: the database is the same one that transactional_db flushes between tests.
    """
    from django.conf import settings

    db = settings.DATABASES["default"]
    if db["ENGINE"] != "django.db.backends.postgresql":
        pytest.skip(
            "browser tests need the PostgreSQL test database that a daphne subprocess can "
            "reach: run them with `make test` (scripts/test.sh)"
        )
    env = subprocess_env(
        DATABASE_URL=database_url(db),  # NAME is test_clusterui once django_db_setup ran
        SECURE_COOKIES="false",  # Chromium on plain http would drop Secure cookies
    )
    server = DaphneServer(env=env, log_path=ARTIFACTS / "daphne.log").start()
    yield server
    server.stop()


@pytest.fixture
def page(transactional_db, daphne_server, monkeypatch, request):
    """A Chromium page whose relative URLs go to the daphne server.

    Playwright's sync API marks its event loop as running in this thread between calls, and
    Django then refuses ORM calls as async-unsafe; allow them for this test only (Django's
    documented switch). Playwright and Chromium start and stop with each test, so no loop
    stays marked running for the tests that come after.
    """
    from django.db import connections
    from playwright.sync_api import sync_playwright

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    playwright = sync_playwright().start()
    try:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        context = browser.new_context(
            base_url=daphne_server.url, viewport={"width": 1280, "height": 900}
        )
        context.set_default_timeout(15_000)
        new_page = context.new_page()
        request.node.console_log = ConsoleLog(new_page)
        yield new_page
        call = getattr(request.node, "rep_call", None)
        if call is not None and call.failed:
            path = screenshot(new_page, f"FAILED-{request.node.name}")
            print(f"screenshot of the page at failure: {path}")
            print(f"browser console:\n{request.node.console_log}")
            print(f"daphne log (tail):\n{daphne_server.log_tail()}")
        context.close()
        browser.close()
    finally:
        # While Playwright's loop counts as running, Django keeps this thread's database
        # connections per context rather than per thread: the test body's ORM calls used
        # a connection of their own. Close it here, or it outlives the test and blocks
        # dropping the test database at the end of the session.
        connections.close_all()
        playwright.stop()


@pytest.fixture
def console(page, request):
    """What `page` logged so far: console messages and page errors (see browser.ConsoleLog)."""
    return request.node.console_log
