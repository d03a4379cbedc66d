"""A real OpenID Connect provider for the sign-in tests: tests/oidc/provider.mjs (the npm
package oidc-provider 8.x on Node.js) on a loopback port, and the CLUSTERUI_OIDC_* variables
that point a console at it.

scripts/test.sh installs the npm package (package.json and package-lock.json beside this
file) into OIDC_PROVIDER_DIR, .venv/oidc-provider unless set."""

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from ..browser import REPO_ROOT, _die_with_parent, free_port

HERE = Path(__file__).resolve().parent
INSTALL_DIR = Path(os.environ.get("OIDC_PROVIDER_DIR") or REPO_ROOT / ".venv" / "oidc-provider")
MODULE = INSTALL_DIR / "node_modules" / "oidc-provider" / "lib" / "index.js"

CLIENT_ID = "clusterui-test"
CLIENT_SECRET = "clusterui-test-client-secret"
# The users of provider.mjs: login, password, and the role their groups map to below.
PASSWORDS = {"olivia": "olivia-password", "victor": "victor-password", "nora": "nora-password"}
ROLE_GROUPS = "admin=platform-admins,operator=platform-oncall,viewer=ml-engineers;researchers"


def missing_requirements():
    """What this machine lacks to run the provider, or "" when nothing."""
    if shutil.which("node") is None:
        return "Node.js (node)"
    if not MODULE.exists():
        return f"the npm package oidc-provider in {INSTALL_DIR}"
    return ""


class OidcProvider:
    """provider.mjs on a free loopback port, for a console that will listen on console_port
    (the client's redirect URIs name it)."""

    def __init__(self, *, console_port, log_path, start_timeout=30.0):
        self.port = free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.console_port = console_port
        self.console_url = f"http://127.0.0.1:{console_port}"
        self.log_path = Path(log_path)
        self.start_timeout = start_timeout
        self.process = None
        self.discovery = None

    def start(self):
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        env = {
            **os.environ,
            "OIDC_PROVIDER_MODULE": str(MODULE),
            "OIDC_PORT": str(self.port),
            "OIDC_CLIENT_ID": CLIENT_ID,
            "OIDC_CLIENT_SECRET": CLIENT_SECRET,
            "OIDC_REDIRECT_URI": f"{self.console_url}/oidc/callback/",
            "OIDC_POST_LOGOUT_REDIRECT_URI": f"{self.console_url}/accounts/signed-out/",
        }
        self.process = subprocess.Popen(
            ["node", str(HERE / "provider.mjs")], cwd=HERE, env=env, stdout=self._log,
            stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + self.start_timeout
        while self.discovery is None:
            if self.process.poll() is not None:
                self.stop()
                raise RuntimeError(f"provider.mjs exited with status {self.process.returncode}:"
                                   f"\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(
                        f"{self.issuer}/.well-known/openid-configuration", timeout=1) as answer:
                    self.discovery = json.load(answer)
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"provider.mjs did not answer within "
                                       f"{self.start_timeout:.0f} s:\n{self.log_tail()}")
                time.sleep(0.1)
        return self

    def console_env(self):
        """The console's sign-in settings, read from the provider's discovery document the
        way the README tells an operator to."""
        document = self.discovery
        return {
            "CLUSTERUI_OIDC_ISSUER": document["issuer"],
            "CLUSTERUI_OIDC_AUTHORIZATION_ENDPOINT": document["authorization_endpoint"],
            "CLUSTERUI_OIDC_TOKEN_ENDPOINT": document["token_endpoint"],
            "CLUSTERUI_OIDC_USERINFO_ENDPOINT": document["userinfo_endpoint"],
            "CLUSTERUI_OIDC_JWKS_URI": document["jwks_uri"],
            "CLUSTERUI_OIDC_END_SESSION_ENDPOINT": document["end_session_endpoint"],
            "CLUSTERUI_OIDC_CLIENT_ID": CLIENT_ID,
            "CLUSTERUI_OIDC_CLIENT_SECRET": CLIENT_SECRET,
            "CLUSTERUI_OIDC_SCOPES": "openid email profile groups",
            "CLUSTERUI_OIDC_ROLE_GROUPS": ROLE_GROUPS,
            "CLUSTERUI_OIDC_TIMEOUT_S": "5",
        }

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
            return "(no provider log)"
        return "\n".join(text.splitlines()[-lines:]) or "(the provider logged nothing)"
