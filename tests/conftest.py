"""Fixtures for the browser and integration tests: daphne against the test database, a
Chromium page, and the processes an integration test starts.

A browser test asks for `page` (and `console` for what the page logged). `page` brings in
`transactional_db`: the test's rows are committed, so the daphne subprocess sees them, and
the tables are flushed after the test. Both need PostgreSQL, i.e. `make test`.

A Slurm test asks for `slurm` (tests/slurm.py's SlurmCluster, with accounting, started once
per session): it is left with no jobs and every node resumed after each test.

An integration test asks for `processes` (tests/integration.py's ProcessGroup): what it
starts there is stopped at the end of the test, before the tables are flushed, also when the
test failed; the logs stay under test-artifacts/<module>/<test>/ and are printed on failure.
"""

import shutil
import tempfile
from pathlib import Path

import pytest

from .browser import (
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_ARGS,
    ConsoleLog,
    DaphneServer,
    database_url,
    free_port,
    screenshot,
    subprocess_env,
)
from .integration import ProcessGroup
from .oidc.provider import OidcProvider
from .oidc.provider import missing_requirements as oidc_missing_requirements
from .slurm import DEBIAN_PACKAGES, SlurmCluster, missing_requirements


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the item, so fixtures can tell that the test failed."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """Browser tests run last (after pytest-django's own ordering, which this keeps).

    The session's daphne (`daphne_server`) starts its live publisher with the first browser
    page and keeps it for the rest of the session; it writes PublisherStatus in the test
    database, which the heartbeat sweep reads. An integration test's own deployment must be
    the only one writing there, so every integration test runs before the first browser test.
    """
    items[:] = ([i for i in items if i.get_closest_marker("browser") is None]
                + [i for i in items if i.get_closest_marker("browser") is not None])


def require_postgresql():
    from django.conf import settings

    if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        pytest.skip(
            "needs the PostgreSQL test database that subprocesses can reach: run it with "
            "`make test` (scripts/test.sh)"
        )
    return settings.DATABASES["default"]


@pytest.fixture(scope="session")
def daphne_server(django_db_setup):
    """daphne serving clusterui.asgi on a free loopback port, against the test database.

    Session-scoped: the database is the same one that transactional_db flushes between tests.
    """
    db = require_postgresql()
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
    yield from chromium_page(daphne_server, monkeypatch, request)


def chromium_page(daphne_server, monkeypatch, request):
    """The `page` fixture's body, for any daphne server."""
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


@pytest.fixture(scope="session")
def oidc_provider(django_db_setup):
    """A real OpenID Connect provider on loopback (tests/oidc/provider.mjs: the npm package
    oidc-provider), set up for the console that `oidc_daphne_server` starts."""
    require_postgresql()
    missing = oidc_missing_requirements()
    if missing:
        pytest.skip(f"needs a real OpenID Connect provider, and this machine lacks {missing}: "
                    f"run it with `make test` (scripts/test.sh installs it)")
    provider = OidcProvider(console_port=free_port(), log_path=ARTIFACTS / "oidc-provider.log")
    yield provider.start()
    provider.stop()


@pytest.fixture(scope="session")
def oidc_daphne_server(oidc_provider):
    """A second daphne, signing people in through `oidc_provider` (CLUSTERUI_OIDC_* set),
    against the same test database as `daphne_server`. No live publisher: the session's
    other daphne runs that."""
    db = require_postgresql()
    env = subprocess_env(
        DATABASE_URL=database_url(db),
        SECURE_COOKIES="false",
        CLUSTERUI_PUBLISHER="false",
        **oidc_provider.console_env(),
    )
    server = DaphneServer(env=env, log_path=ARTIFACTS / "daphne-oidc.log",
                          port=oidc_provider.console_port).start()
    yield server
    server.stop()


@pytest.fixture
def oidc_page(transactional_db, oidc_daphne_server, monkeypatch, request):
    """Like `page`, for the daphne that signs in through the OpenID Connect provider."""
    yield from chromium_page(oidc_daphne_server, monkeypatch, request)


@pytest.fixture
def console(page, request):
    """What `page` logged so far: console messages and page errors (see browser.ConsoleLog)."""
    return request.node.console_log


@pytest.fixture
def processes(transactional_db, request):
    """A ProcessGroup for this test, with the environment of the session's production mode
    pointed at the test database. Everything in it stops before the tables are flushed."""
    db = require_postgresql()
    directory = ARTIFACTS / request.node.path.stem / request.node.name
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    env = subprocess_env(
        DATABASE_URL=database_url(db),  # NAME is the test database's
        SECURE_COOKIES="false",
        PYTHONUNBUFFERED="1",
    )
    group = ProcessGroup(directory, env)
    try:
        yield group
    finally:
        group.stop_all()
        failed = any(getattr(request.node, f"rep_{when}", None) is not None
                     and getattr(request.node, f"rep_{when}").failed
                     for when in ("setup", "call"))
        if failed:
            group.report()


@pytest.fixture(scope="session")
def slurm_cluster():
    """A real Slurm cluster for the session: munged, MariaDB, slurmdbd, slurmctld and the
    slurmds of gpu-001..gpu-004 (8 GPUs each). Its logs end up in test-artifacts/slurm/."""
    missing = missing_requirements()
    if missing:
        pytest.skip(f"needs a real Slurm cluster, and this machine lacks {missing}: run it "
                    f"with `make test` (scripts/test.sh installs {DEBIAN_PACKAGES})")
    # In /tmp, not pytest's tmp_path: job users must reach the configuration and munged.
    directory = Path(tempfile.mkdtemp(prefix="clusterui-slurm.", dir="/tmp"))
    cluster = SlurmCluster(directory, accounting=True)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        cluster.keep_logs(ARTIFACTS / "slurm")
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def slurm(slurm_cluster, request):
    """The session's Slurm cluster; after the test no job is left and every node is back
    in service. A failed test prints the end of the daemons' logs."""
    yield slurm_cluster
    failed = any(getattr(request.node, f"rep_{when}", None) is not None
                 and getattr(request.node, f"rep_{when}").failed
                 for when in ("setup", "call"))
    if failed:
        print(f"Slurm logs (tail):\n{slurm_cluster.log_tails()}")
    slurm_cluster.reset()
