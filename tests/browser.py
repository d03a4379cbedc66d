"""Helpers for the browser tests: a daphne server in a subprocess, Chromium through Playwright,
the console messages a page logs, and screenshots under test-artifacts/."""

import ctypes
import os
import re
import threading
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

REPO_ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO_ROOT / "test-artifacts"

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",  # as root the sandbox must be off
    "--disable-gpu",
    # Without these Chromium keeps trying hosts that the test network refuses.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def database_url(db):
    """A postgres:// URL for a Django DATABASES entry (the test database, once created)."""
    user = quote(db.get("USER") or "", safe="")
    password = db.get("PASSWORD") or ""
    auth = f"{user}:{quote(password, safe='')}@" if password else (f"{user}@" if user else "")
    host = db.get("HOST") or "127.0.0.1"
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"postgres://{auth}{host}{port}/{quote(str(db['NAME']), safe='')}"


def _die_with_parent():
    """In the child, before exec: SIGTERM when pytest dies, even if it is killed (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (AttributeError, OSError):
        pass


class DaphneServer:
    """`daphne clusterui.asgi:application` on a free loopback port, stderr in a log file."""

    def __init__(self, *, env, log_path, port=None, start_timeout=30.0):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = env
        self.log_path = Path(log_path)
        self.start_timeout = start_timeout
        self.process = None

    def start(self):
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-e",
             f"tcp:port={self.port}:interface=127.0.0.1:backlog=4096",
             "clusterui.asgi:application"],
            cwd=REPO_ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self.process.poll() is not None:
                self.stop()
                raise RuntimeError(
                    f"daphne exited with status {self.process.returncode} before it listened "
                    f"on port {self.port}:\n{self.log_tail()}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"daphne did not listen on port {self.port} within "
                    f"{self.start_timeout:.0f} s:\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if not self._log.closed:
            self._log.close()

    def log_tail(self, lines=60):
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no daphne log)"
        return "\n".join(text.splitlines()[-lines:]) or "(daphne logged nothing)"


class ConsoleLog:
    """What a page logged: console messages and uncaught errors, as 'type: text' lines."""

    def __init__(self, page):
        self.messages = []
        self.errors = []
        page.on("console", lambda msg: self.messages.append(f"{msg.type}: {msg.text}"))
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        # Report violations as console errors too: a blocked resource always logs one,
        # but an event names the directive even where Chromium's message is terse.
        page.add_init_script(
            "document.addEventListener('securitypolicyviolation', e => console.error("
            "'Content Security Policy violation: ' + e.violatedDirective + ' blocked ' + "
            "(e.blockedURI || 'inline') + ' at ' + e.sourceFile + ':' + e.lineNumber));"
        )

    def csp_violations(self):
        return [m for m in self.messages + self.errors if "content security policy" in m.lower()]

    def __str__(self):
        return "\n".join(self.messages + [f"pageerror: {e}" for e in self.errors]) or "(empty)"


def assert_no_csp_violations(console):
    """The page ran under our Content Security Policy without anything being blocked."""
    violations = console.csp_violations()
    assert not violations, "Content Security Policy violations:\n" + "\n".join(violations)


def screenshot(page, name):
    """Save a full-page screenshot as test-artifacts/<name>.png and return its path."""
    ARTIFACTS.mkdir(exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "page"
    path = ARTIFACTS / f"{safe}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def in_a_thread(function, *args, timeout_s=60):
    """Run `function` where no event loop runs, and return what it returns. Playwright's
    sync API keeps its loop marked running in the test's thread, and there async_to_sync,
    which sends the on-commit broadcasts ("repair.changed"...), refuses to run: they would
    be lost without a word."""
    from django.db import connections

    outcome = {}

    def run():
        try:
            outcome["value"] = function(*args)
        except BaseException as error:  # noqa: BLE001 - re-raised in the test's thread
            outcome["error"] = error
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=timeout_s)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def element_screenshot(locator, name):
    """Save a screenshot of one element as test-artifacts/<name>.png and return its path."""
    ARTIFACTS.mkdir(exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "element"
    path = ARTIFACTS / f"{safe}.png"
    from playwright.sync_api import Error as PlaywrightError

    for attempts_left in (2, 1, 0):
        try:
            locator.screenshot(path=str(path))
            break
        except PlaywrightError as error:
            # A live refresh (static/js/refresh.js fetches once the socket opens) replaced
            # the element while it was photographed; the locator finds the new one.
            if "not attached to the DOM" not in str(error) or not attempts_left:
                raise
    return path


def sign_in(page, username, password="password"):
    """Fill and submit the sign-in form that the current page shows."""
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    with page.expect_navigation():
        page.click("form button[type=submit]")


def subprocess_env(**overrides):
    """This process's environment, with the overrides and without test-only switches."""
    env = dict(os.environ)
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    env.update(overrides)
    return env
