"""The fan-out bench's browsers: one user with the viewer role and N signed-in sessions.

    python bench/fanout/viewers.py --sessions 200 --out viewers.json

Writes {"cookie_name", "session_keys": [...]} to --out. Each session holds what
django.contrib.auth.login() puts in one (_auth_user_id, _auth_user_backend,
_auth_user_hash), in the configured session store, so the live socket's
AuthMiddlewareStack finds the user exactly as it does for a browser that signed in.
Runs in the environment's mode (bench/fanout/run.sh: production). Not measured.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "clusterui.settings")

USERNAME = "bench-viewer"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import django

    django.setup()
    from importlib import import_module

    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.auth import get_user_model

    from clusters.roles import Role, assign_role

    started = time.monotonic()
    user, _ = get_user_model().objects.get_or_create(username=USERNAME)
    user.set_unusable_password()
    user.save()
    assign_role(user, Role.VIEWER)  # the lowest role that may watch a cluster
    store_class = import_module(settings.SESSION_ENGINE).SessionStore
    backend = "django.contrib.auth.backends.ModelBackend"
    keys = []
    for _ in range(args.sessions):
        session = store_class()
        session[SESSION_KEY] = user._meta.pk.value_to_string(user)
        session[BACKEND_SESSION_KEY] = backend
        session[HASH_SESSION_KEY] = user.get_session_auth_hash()
        session.create()
        keys.append(session.session_key)
    Path(args.out).write_text(json.dumps({"cookie_name": settings.SESSION_COOKIE_NAME,
                                          "username": USERNAME, "session_keys": keys}))
    print(f"viewers: {len(keys)} sessions of {USERNAME} (viewer) in {settings.SESSION_ENGINE} "
          f"({time.monotonic() - started:.1f} s)")


if __name__ == "__main__":
    main()
