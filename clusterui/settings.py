"""clusterui settings: one file, driven by the environment.

CLUSTERUI_MODE picks the mode:
- embedded (default): SQLite, in-memory channel layer, a Celery broker on a SQLite file.
  Nothing to install; for the demo and a laptop.
- production: PostgreSQL (DATABASE_URL), Redis (REDIS_URL) for the channel layer, the
  Celery broker, the cache and the live store. Every required variable must be set.

.env.example lists every variable.
"""

import ipaddress
import os
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from csp.constants import NONCE, NONE, SELF
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def envstr(name, default=None):
    value = os.environ.get(name, "")
    return value if value != "" else default


def envbool(name, default):
    value = envstr(name)
    if value is None:
        return default
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(f"{name} must be true or false, got {value!r}")


def envint(name, default):
    value = envstr(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {value!r}") from None


def envfloat(name, default):
    value = envstr(name)
    if value is None:
        return default
    try:
        return float(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, got {value!r}") from None


def envnetworks(name):
    """Comma-separated addresses or CIDR networks, as ipaddress networks."""
    networks = []
    for item in (envstr(name) or "").split(","):
        if item.strip():
            try:
                networks.append(ipaddress.ip_network(item.strip(), strict=False))
            except ValueError:
                raise ImproperlyConfigured(
                    f"{name}: {item.strip()!r} is not an address or network") from None
    return tuple(networks)


def envsecret(name, default=None):
    """A secret from NAME, or from the file that NAME_FILE names (Docker/K8s secrets)."""
    path = envstr(f"{name}_FILE")
    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE: cannot read {path}: {exc}") from None
    return envstr(name, default)


def required(name, value):
    if value in (None, ""):
        raise ImproperlyConfigured(
            f"{name} is required when CLUSTERUI_MODE=production (see .env.example)"
        )
    return value


MODE = envstr("CLUSTERUI_MODE", "embedded")
if MODE not in ("embedded", "production"):
    raise ImproperlyConfigured(f"CLUSTERUI_MODE must be embedded or production, got {MODE!r}")
EMBEDDED = MODE == "embedded"
DATA_DIR = Path(envstr("CLUSTERUI_DATA_DIR", str(BASE_DIR / "var")))

DEBUG = envbool("DEBUG", False)

if EMBEDDED:
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    SECRET_KEY = envsecret("SECRET_KEY", "embedded-mode-only-not-a-secret-" + "x" * 32)
    ALLOWED_HOSTS = envstr("ALLOWED_HOSTS", "127.0.0.1,localhost").split(",")
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": DATA_DIR / "clusterui.sqlite3",
            "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"},
        }
    }
    REDIS_URL = None
else:
    SECRET_KEY = required("SECRET_KEY", envsecret("SECRET_KEY"))
    if len(SECRET_KEY) < 50:
        raise ImproperlyConfigured("SECRET_KEY must be at least 50 characters long")
    ALLOWED_HOSTS = required("ALLOWED_HOSTS", envstr("ALLOWED_HOSTS")).split(",")
    database_url = required("DATABASE_URL", envsecret("DATABASE_URL"))
    try:
        DATABASES = {"default": dj_database_url.parse(database_url)}
    except Exception as exc:
        raise ImproperlyConfigured(f"DATABASE_URL is malformed: {exc}") from None
    if DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        raise ImproperlyConfigured("DATABASE_URL must be a postgres:// URL in production mode")
    # A pool per process (psycopg_pool), shared by its threads. Persistent connections
    # (CONN_MAX_AGE) are not reused under ASGI: every request runs in a thread of its own and
    # left one more connection open, until PostgreSQL ran out of slots (bench/reconnect).
    # With the pool, closing a connection hands it back: a request does at its end, and every
    # thread of the server's own (agents, events, the publisher) after each call
    # (database_sync_to_async). More slots than a process has such threads (4 + 4 + 1 + 2,
    # and the requests in hand), so none waits while PostgreSQL is up; while it is away a
    # caller fails within 2 s (agents are answered server_error and send again).
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 1, "max_size": envint("CLUSTERUI_DB_POOL_SIZE", 20), "timeout": 2}
    REDIS_URL = required("REDIS_URL", envsecret("REDIS_URL"))
    if not REDIS_URL.startswith(("redis://", "rediss://", "unix://")):
        raise ImproperlyConfigured(f"REDIS_URL must be a redis:// URL, got {REDIS_URL!r}")

CSRF_TRUSTED_ORIGINS = [o for o in envstr("CSRF_TRUSTED_ORIGINS", "").split(",") if o]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "django_htmx",
    "template_partials",
    "django_filters",
    "csp",
    "ninja",  # the API docs' Swagger UI from the installed package's static files, no CDN
    "channels",
    "clusters",
    "nodes",
    "healthchecks",
    "jobs",
    "repairs",
    "startup",
    "notifications",
    "overview",
    "gateway",
    "api",
    "demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Before LoginRequiredMiddleware: it turns that one's redirects into HX-Redirect too.
    "clusterui.middleware.SignInRedirectMiddleware",
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "clusterui.middleware.VaryOnHtmxMiddleware",
]

ROOT_URLCONF = "clusterui.urls"
ASGI_APPLICATION = "clusterui.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "builtins": ["template_partials.templatetags.partials"],
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "csp.context_processors.nonce",
                "clusterui.context_processors.console",
            ],
        },
    }
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"


# --- Sign-in: OpenID Connect, break-glass ------------------------------------------------
# OpenID Connect sign-in (mozilla-django-oidc) is on when CLUSTERUI_OIDC_ISSUER is set; the
# endpoints, the client and the group -> role mapping are then required. Without it, local
# accounts sign in on /accounts/login/ (the embedded demo). README "Sign-in" has the values
# for Keycloak and Entra ID.


def envendpoint(name):
    """An IdP URL: https, or http on loopback (a provider on this machine, as in tests)."""
    value = envstr(name)
    if value is None:
        return None
    if not value.startswith(("https://", "http://127.", "http://localhost", "http://[::1]")):
        raise ImproperlyConfigured(f"{name} must be an https:// URL, got {value!r}")
    return value


CLUSTERUI_OIDC_ISSUER = envendpoint("CLUSTERUI_OIDC_ISSUER") or ""
CLUSTERUI_OIDC_ENABLED = bool(CLUSTERUI_OIDC_ISSUER)
OIDC_OP_AUTHORIZATION_ENDPOINT = envendpoint("CLUSTERUI_OIDC_AUTHORIZATION_ENDPOINT")
OIDC_OP_TOKEN_ENDPOINT = envendpoint("CLUSTERUI_OIDC_TOKEN_ENDPOINT")
OIDC_OP_USER_ENDPOINT = envendpoint("CLUSTERUI_OIDC_USERINFO_ENDPOINT")
OIDC_OP_JWKS_ENDPOINT = envendpoint("CLUSTERUI_OIDC_JWKS_URI")
# Optional (Google has none): without it, sign-out ends the session here only.
CLUSTERUI_OIDC_END_SESSION_ENDPOINT = envendpoint("CLUSTERUI_OIDC_END_SESSION_ENDPOINT") or ""
CLUSTERUI_OIDC_CLIENT_ID = envstr("CLUSTERUI_OIDC_CLIENT_ID", "")
OIDC_RP_CLIENT_ID = CLUSTERUI_OIDC_CLIENT_ID
OIDC_RP_CLIENT_SECRET = envsecret("CLUSTERUI_OIDC_CLIENT_SECRET")
role_groups = envstr("CLUSTERUI_OIDC_ROLE_GROUPS")
oidc_required = {
    "CLUSTERUI_OIDC_AUTHORIZATION_ENDPOINT": OIDC_OP_AUTHORIZATION_ENDPOINT,
    "CLUSTERUI_OIDC_TOKEN_ENDPOINT": OIDC_OP_TOKEN_ENDPOINT,
    "CLUSTERUI_OIDC_USERINFO_ENDPOINT": OIDC_OP_USER_ENDPOINT,
    "CLUSTERUI_OIDC_JWKS_URI": OIDC_OP_JWKS_ENDPOINT,
    "CLUSTERUI_OIDC_CLIENT_ID": CLUSTERUI_OIDC_CLIENT_ID,
    "CLUSTERUI_OIDC_CLIENT_SECRET": OIDC_RP_CLIENT_SECRET,
    "CLUSTERUI_OIDC_ROLE_GROUPS": role_groups,
}
oidc_optional = {"CLUSTERUI_OIDC_END_SESSION_ENDPOINT": CLUSTERUI_OIDC_END_SESSION_ENDPOINT}
for variable, value in {**oidc_required, **oidc_optional}.items():
    if CLUSTERUI_OIDC_ENABLED and not value and variable in oidc_required:
        raise ImproperlyConfigured(
            f"{variable} is required when CLUSTERUI_OIDC_ISSUER is set (see .env.example)")
    # Half a configuration must not leave the console quietly on local accounts.
    if not CLUSTERUI_OIDC_ENABLED and value:
        raise ImproperlyConfigured(
            f"CLUSTERUI_OIDC_ISSUER is required when {variable} is set (see .env.example)")
OIDC_RP_SIGN_ALGO = "RS256"  # ID tokens are checked against the provider's JWKS
OIDC_USE_PKCE = True
OIDC_RP_SCOPES = envstr("CLUSTERUI_OIDC_SCOPES", "openid email profile")
if "openid" not in OIDC_RP_SCOPES.split():
    raise ImproperlyConfigured(
        f"CLUSTERUI_OIDC_SCOPES must include openid, got {OIDC_RP_SCOPES!r}")
OIDC_TIMEOUT = envfloat("CLUSTERUI_OIDC_TIMEOUT_S", 10.0)
client_auth = envstr("CLUSTERUI_OIDC_CLIENT_AUTH", "client_secret_basic")
if client_auth not in ("client_secret_basic", "client_secret_post"):
    raise ImproperlyConfigured(
        f"CLUSTERUI_OIDC_CLIENT_AUTH must be client_secret_basic or client_secret_post, "
        f"got {client_auth!r}")
OIDC_TOKEN_USE_BASIC_AUTH = client_auth == "client_secret_basic"
# The claim that lists the user's IdP groups, and which groups give which role:
# "admin=platform-admins,operator=platform-oncall,viewer=ml-engineers;researchers" (read by
# clusters.oidc.role_groups(), which the clusters app checks at start-up).
CLUSTERUI_OIDC_GROUPS_CLAIM = envstr("CLUSTERUI_OIDC_GROUPS_CLAIM", "groups")
CLUSTERUI_OIDC_ROLE_GROUPS = role_groups if CLUSTERUI_OIDC_ENABLED else ""
# Every this many seconds a signed-in user's next page load goes by the provider again
# (silently while their IdP session lasts), which also re-syncs their role.
OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS = envint("CLUSTERUI_OIDC_RENEW_S", 900)
OIDC_STORE_ID_TOKEN = True  # the id_token_hint of the provider's sign-out
OIDC_EXEMPT_URLS = ["login", "logout", "break_glass", "sign_in_failed", "signed_out"]
LOGIN_REDIRECT_URL_FAILURE = "sign_in_failed"
AUTHENTICATION_BACKENDS = (
    ["clusters.oidc.OIDCBackend"] if CLUSTERUI_OIDC_ENABLED else []
) + ["django.contrib.auth.backends.ModelBackend"]
# Browsers hold form-action to the redirects after a form too: sign-out (a form) ends at the
# provider's end_session endpoint, and a form sent after the session ended at its sign-in.
OIDC_FORM_ACTION_ORIGINS = sorted({
    "{0.scheme}://{0.netloc}".format(urlsplit(url))
    for url in (OIDC_OP_AUTHORIZATION_ENDPOINT, CLUSTERUI_OIDC_END_SESSION_ENDPOINT) if url
})
# The break-glass sign-in for local admin accounts on /accounts/break-glass/ (404 when off).
CLUSTERUI_BREAK_GLASS = envbool("CLUSTERUI_BREAK_GLASS", True)
# Password guessing (local form and break-glass; clusters/sign_in_limits.py): an account
# name is locked from one address after this many refusals within the window, and an
# address after ..._PER_ADDRESS over all names.
# Behind proxies or load balancers: their addresses or networks, whose X-Forwarded-For is
# believed. A request's client is the rightmost X-Forwarded-For address that is not one of
# them (clusters.services.client_ip); the leftmost is whatever the client wrote. Empty:
# the socket's peer. It is the address of the audit trail and of the sign-in limits.
CLUSTERUI_TRUSTED_PROXIES = envnetworks("CLUSTERUI_TRUSTED_PROXIES")
CLUSTERUI_SIGN_IN_MAX_FAILURES = envint("CLUSTERUI_SIGN_IN_MAX_FAILURES", 5)
CLUSTERUI_SIGN_IN_MAX_FAILURES_PER_ADDRESS = envint("CLUSTERUI_SIGN_IN_MAX_FAILURES_PER_ADDRESS", 20)
CLUSTERUI_SIGN_IN_LOCKOUT_S = envint("CLUSTERUI_SIGN_IN_LOCKOUT_S", 900)

LANGUAGE_CODE = "en-us"
TIME_ZONE = envstr("TIME_ZONE", "UTC")
USE_TZ = True
USE_I18N = False
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
# htmx comes from django-htmx's own static files; plotly.js from the plotly package.
PLOTLY_JS = Path(__import__("plotly").__file__).parent / "package_data" / "plotly.min.js"
# Diagnostic bundles (nodes/bundles.py): files under the data directory, or, with
# CLUSTERUI_BUNDLE_S3_BUCKET, an S3-compatible bucket (django-storages; the endpoint, region
# and keys from CLUSTERUI_BUNDLE_S3_ENDPOINT_URL, _REGION, AWS_ACCESS_KEY_ID and
# AWS_SECRET_ACCESS_KEY, or the machine's own role).
CLUSTERUI_BUNDLE_S3_BUCKET = envstr("CLUSTERUI_BUNDLE_S3_BUCKET")
if CLUSTERUI_BUNDLE_S3_BUCKET:
    BUNDLE_STORAGE = {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {"bucket_name": CLUSTERUI_BUNDLE_S3_BUCKET,
                    "endpoint_url": envstr("CLUSTERUI_BUNDLE_S3_ENDPOINT_URL"),
                    "region_name": envstr("CLUSTERUI_BUNDLE_S3_REGION"),
                    "location": "bundles", "file_overwrite": False, "default_acl": None,
                    "querystring_auth": False},
    }
else:
    BUNDLE_STORAGE = {"BACKEND": "django.core.files.storage.FileSystemStorage",
                      "OPTIONS": {"location": str(DATA_DIR / "bundles")}}
# The most a bundle may weigh (PROTOCOL.md collect_bundle max_bytes), how long the agent has
# (deadline_s, which is also the longest a bundle holds a repair up), how much its files may
# hold once unpacked (a gzip bomb is refused), and how long bundles are kept.
CLUSTERUI_BUNDLE_MAX_BYTES = envint("CLUSTERUI_BUNDLE_MAX_BYTES", 64 * 1024 * 1024)
CLUSTERUI_BUNDLE_DEADLINE_S = envint("CLUSTERUI_BUNDLE_DEADLINE_S", 120)
CLUSTERUI_BUNDLE_MAX_UNPACKED_BYTES = envint("CLUSTERUI_BUNDLE_MAX_UNPACKED_BYTES",
                                             1024 * 1024 * 1024)
CLUSTERUI_BUNDLE_RETENTION_DAYS = envint("CLUSTERUI_BUNDLE_RETENTION_DAYS", 90)

STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "bundles": BUNDLE_STORAGE,
    # Hashed names, gzip and Brotli (collectstatic: scripts/test.sh, scripts/demo.sh, the
    # README's production steps), served by whitenoise with a year's cache: plotly.min.js is
    # 4.8 MB as it is, about a fifth of that compressed.
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    "clusterui.staticfinders.VendoredPackageFinder",
]

# Content Security Policy: scripts only from 'self' and with the page's nonce, no eval.
# plotly.js writes <style> elements at run time (its modebar and hover styles), so styles
# also allow 'unsafe-inline'; nothing else does.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF, NONCE],
        "style-src": [SELF, "'unsafe-inline'"],
        "img-src": [SELF, "data:"],
        "font-src": [SELF],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF, *OIDC_FORM_ACTION_ORIGINS],
        "frame-ancestors": [NONE],
    }
}

SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SECURE = envbool("SECURE_COOKIES", not EMBEDDED)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 0 if EMBEDDED else 31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = not EMBEDDED
SECURE_HSTS_PRELOAD = envbool("SECURE_HSTS_PRELOAD", not EMBEDDED)
# Behind a TLS-terminating proxy that already redirects, this may be turned off.
SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", not EMBEDDED)
# Load balancers probe /healthz over plain HTTP, and may not follow a redirect.
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"

if EMBEDDED:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    CELERY_BROKER_URL = envstr(
        "CELERY_BROKER_URL", f"sqla+sqlite:///{DATA_DIR / 'celery-broker.sqlite3'}"
    )
else:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "clusterui.channel_layer.RedisChannelLayer",
            # channels-redis waits up to 5 s in Redis for a message; redis-py's own socket
            # timeout (5 s by default) must be longer, or an idle consumer's receive fails.
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 10}]},
        }
    }
    CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}
    }
    CELERY_BROKER_URL = envstr("CELERY_BROKER_URL", REDIS_URL)
    # A task taken by a worker that died (acks_late) goes back to the queue after this long.
    # Longer than any task may run (a repair's provider command: 600 s), or a task still
    # running would be handed to a second worker.
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": envint("CELERY_VISIBILITY_TIMEOUT_S", 1200)}

# Five queues (DESIGN.md "Data flow"): the periodic sweeps (heartbeats, node states, due
# repair steps, deadlines) on their own, so they never wait behind other work; the
# recommender's tick and sweep on theirs, so a storm's notifications never delay a
# recommendation; the providers' long commands (a reprovision may run 10 minutes) on
# another; sending notifications (a slow receiver) on another; everything else (the
# notifier's tick, repair steps) on the default. A worker started without -Q takes them
# all; a deployment runs one worker per queue (README "Running it in production").
CELERY_TASK_DEFAULT_QUEUE = "celery"
SWEEPS_QUEUE = "sweeps"
RECOMMEND_QUEUE = "recommend"
PROVIDER_QUEUE = "provider"
NOTIFY_QUEUE = "notify"
CELERY_TASK_QUEUES = {name: {} for name in (CELERY_TASK_DEFAULT_QUEUE, SWEEPS_QUEUE,
                                            RECOMMEND_QUEUE, PROVIDER_QUEUE, NOTIFY_QUEUE)}
CELERY_TASK_ROUTES = {name: {"queue": SWEEPS_QUEUE} for name in (
    "healthchecks.tasks.sweep_heartbeats",
    "nodes.tasks.refresh_due_node_states",
    "startup.tasks.end_overdue_boot_holds",
    "healthchecks.tasks.sweep_health_events",
    "healthchecks.tasks.expire_check_runs",
    "nodes.tasks.expire_commands",
    "repairs.tasks.advance_repairs",
)} | {name: {"queue": RECOMMEND_QUEUE} for name in (
    "repairs.tasks.recommend_from_changes",
    "repairs.tasks.sweep_recommendations",
)} | {"notifications.tasks.deliver": {"queue": NOTIFY_QUEUE}}
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True


def every(seconds, task):
    """A beat entry whose message expires when the next one is due: a worker that fell behind
    runs the latest, not a backlog of them, and a repair step is not queued behind a pile."""
    return {"task": task, "schedule": seconds, "options": {"expires": seconds}}


# One beat per deployment: a second one stands by (clusterui/beat.py). Its Redis lock's key
# (default clusterui:beat:<database name>).
CELERY_BEAT_SCHEDULER = "clusterui.beat:SingleBeatScheduler"
CLUSTERUI_BEAT_LOCK = envstr("CLUSTERUI_BEAT_LOCK")
CELERY_BEAT_SCHEDULE = {
    "refresh-node-states": every(10.0, "nodes.tasks.refresh_due_node_states"),
    "end-overdue-boot-holds": every(10.0, "startup.tasks.end_overdue_boot_holds"),
    "sweep-heartbeats": every(1.0, "healthchecks.tasks.sweep_heartbeats"),
    "prune-rollups": every(3600.0, "nodes.tasks.prune_rollups"),
    "prune-changes": every(3600.0, "clusterui.tasks.prune_changes"),
    "prune-event-receipts": every(3600.0, "nodes.tasks.prune_event_receipts"),
    "prune-bundles": every(3600.0, "nodes.tasks.prune_bundles"),
    "prune-script-runs": every(3600.0, "startup.tasks.prune_script_runs"),
    "prune-closed-events": every(3600.0, "healthchecks.tasks.prune_closed_events"),
    "prune-audit": every(3600.0, "clusterui.tasks.prune_audit"),
    "sweep-health-events": every(60.0, "healthchecks.tasks.sweep_health_events"),
    "expire-check-runs": every(30.0, "healthchecks.tasks.expire_check_runs"),
    "expire-agent-commands": every(30.0, "nodes.tasks.expire_commands"),
    "advance-repairs": every(5.0, "repairs.tasks.advance_repairs"),
    "recommend-from-changes": every(1.0, "repairs.tasks.recommend_from_changes"),
    "sweep-recommendations": every(60.0, "repairs.tasks.sweep_recommendations"),
    "import-jobs": every(60.0, "jobs.tasks.import_jobs"),
    "notify": every(2.0, "notifications.tasks.notify"),
    "retry-notification-deliveries": every(10.0, "notifications.tasks.retry_deliveries"),
    "prune-notifications": every(3600.0, "notifications.tasks.prune_notifications"),
}

# Notifications (notifications/): messages link to the console at this address (what the
# operators' browsers use; behind a proxy, the public URL). A repair with no progress for
# this long counts as stuck.
CLUSTERUI_PUBLIC_URL = envstr("CLUSTERUI_PUBLIC_URL", "http://localhost:8000")
# The API (/api/v1/): requests a minute per token, and the longest life of a new token.
CLUSTERUI_API_RATE_PER_MIN = envint("CLUSTERUI_API_RATE_PER_MIN", 600)
CLUSTERUI_API_TOKEN_MAX_DAYS = envint("CLUSTERUI_API_TOKEN_MAX_DAYS", 365)
CLUSTERUI_NOTIFY_REPAIR_STUCK_S = envint("CLUSTERUI_NOTIFY_REPAIR_STUCK_S", 3600)
# Resolved alerts and the delivery log are kept this many days.
CLUSTERUI_NOTIFY_RETENTION_DAYS = envint("CLUSTERUI_NOTIFY_RETENTION_DAYS", 30)

# The first job import of a cluster reads this many days of Slurm's accounting.
CLUSTERUI_JOBS_BACKFILL_DAYS = envint("CLUSTERUI_JOBS_BACKFILL_DAYS", 30)

# Node state timing (DESIGN.md "Node states").
CLUSTERUI_BOOT_WINDOW_S = envint("CLUSTERUI_BOOT_WINDOW_S", 120)
# PROTOCOL.md's Limits on what one agent connection, and one node, may send: every frame but
# samples goes through a token bucket (this many a second, bursts of that many); a node has
# at most so many open events, and stores at most so many new events an hour. Past them a
# frame is answered rate_limited; a connection that goes on past it for the close time is
# closed with 4429.
CLUSTERUI_AGENT_FRAMES_PER_S = envfloat("CLUSTERUI_AGENT_FRAMES_PER_S", 20.0)
CLUSTERUI_AGENT_FRAME_BURST = envint("CLUSTERUI_AGENT_FRAME_BURST", 200)
CLUSTERUI_AGENT_OPEN_EVENTS_MAX = envint("CLUSTERUI_AGENT_OPEN_EVENTS_MAX", 1000)
CLUSTERUI_AGENT_NEW_EVENTS_PER_HOUR = envint("CLUSTERUI_AGENT_NEW_EVENTS_PER_HOUR", 10000)
CLUSTERUI_AGENT_RATE_LIMIT_CLOSE_S = envfloat("CLUSTERUI_AGENT_RATE_LIMIT_CLOSE_S", 60.0)
# A join token's life unless its maker picks another (PROTOCOL.md: 24 hours).
CLUSTERUI_JOIN_TOKEN_HOURS = envint("CLUSTERUI_JOIN_TOKEN_HOURS", 24)
# Agents send a sample this often (the welcome and config frames tell them).
CLUSTERUI_SAMPLE_INTERVAL_S = envfloat("CLUSTERUI_SAMPLE_INTERVAL_S", 1.0)
# No frame for this many sample intervals: the node's heartbeat is lost.
CLUSTERUI_HEARTBEAT_INTERVALS = envint("CLUSTERUI_HEARTBEAT_INTERVALS", 3)
# After the console (re)starts, agents get this long to reconnect (their backoff tops at 30 s)
# before silence counts against them.
CLUSTERUI_HEARTBEAT_GRACE_S = envint("CLUSTERUI_HEARTBEAT_GRACE_S", 30)
# Per-minute rollups are kept this long (long-term history belongs in Prometheus).
CLUSTERUI_ROLLUP_RETENTION_DAYS = envint("CLUSTERUI_ROLLUP_RETENTION_DAYS", 30)
# Rows of the change feed (clusters/change_feed.py) are kept this long.
CLUSTERUI_CHANGE_RETENTION_DAYS = envint("CLUSTERUI_CHANGE_RETENTION_DAYS", 7)
# How long an agent event's id is remembered (a resend within it is acked, not stored twice).
CLUSTERUI_EVENT_RECEIPT_RETENTION_DAYS = envint("CLUSTERUI_EVENT_RECEIPT_RETENTION_DAYS", 30)
# Startup script runs (their exit codes and output tails) are kept this long.
CLUSTERUI_SCRIPT_RUN_RETENTION_DAYS = envint("CLUSTERUI_SCRIPT_RUN_RETENTION_DAYS", 90)
# Closed health events are kept this long, and for good where a repair names them as its
# evidence. At least 90 days: a repair card shows 90 days of each GPU's and node's history.
CLUSTERUI_CLOSED_EVENT_RETENTION_DAYS = envint("CLUSTERUI_CLOSED_EVENT_RETENTION_DAYS", 365)
if CLUSTERUI_CLOSED_EVENT_RETENTION_DAYS < 90:
    raise ImproperlyConfigured(
        "CLUSTERUI_CLOSED_EVENT_RETENTION_DAYS must be at least 90: a repair card shows 90 "
        f"days of each GPU's history (got {CLUSTERUI_CLOSED_EVENT_RETENTION_DAYS})")
# The audit trail is kept for good unless an admin sets a retention here (days).
CLUSTERUI_AUDIT_RETENTION_DAYS = envint("CLUSTERUI_AUDIT_RETENTION_DAYS", None)
# The creation page recommends acceptance tests from this many GPUs (or a long-running cluster).
CLUSTERUI_ACCEPTANCE_RECOMMENDED_FROM_GPUS = envint("CLUSTERUI_ACCEPTANCE_RECOMMENDED_FROM_GPUS", 64)
# The agent's wheelhouse (nodes/wheelhouse.py): the agent's wheel and its dependencies, built
# by `manage.py build_agent_wheelhouse` at install time and served at /agent/wheels/.
CLUSTERUI_AGENT_WHEELHOUSE = Path(envstr("CLUSTERUI_AGENT_WHEELHOUSE",
                                         str(DATA_DIR / "agent-wheels")))
# The CA certificates (PEM) nodes check the console's certificate against, for a console on a
# private PKI: the install command carries them. Unset: the nodes' system CAs.
CLUSTERUI_AGENT_CA_FILE = envstr("CLUSTERUI_AGENT_CA_FILE")
# Bearer token Prometheus presents at /metrics; /metrics is off while it is unset.
CLUSTERUI_METRICS_TOKEN = envsecret("CLUSTERUI_METRICS_TOKEN")
# The secrets store's keys (clusters/secret_store.py): Fernet keys, comma-separated, the first
# encrypts and every one decrypts (add a new key first, run `manage.py rotate_secrets`, then
# drop the old one). From CLUSTERUI_SECRETS_KEYS or the file CLUSTERUI_SECRETS_KEYS_FILE
# names; never the database. Embedded mode without one: a key file in the data dir, made
# on first use.
CLUSTERUI_SECRETS_KEYS = [key.strip() for key in (envsecret("CLUSTERUI_SECRETS_KEYS") or "")
                          .split(",") if key.strip()]
CLUSTERUI_SECRETS_KEY_FILE = (DATA_DIR / "secrets.key"
                              if MODE == "embedded" and not CLUSTERUI_SECRETS_KEYS else None)
# Node pages link to Grafana when this is set: a URL with {node} and {cluster} in it.
CLUSTERUI_GRAFANA_NODE_URL = envstr("CLUSTERUI_GRAFANA_NODE_URL", "")
# Whether server processes start the live publisher (tests of consumers turn it off).
CLUSTERUI_PUBLISHER = envbool("CLUSTERUI_PUBLISHER", True)
# Whether this server process may lead the live publisher (production: whoever holds a Redis
# lease; embedded mode's one process always does). The leader folds every process's samples
# (nodes/live_store.py). false beside `manage.py publisher`, which always may: daphne and
# the agent gateways then spend nothing on the fold (README.md, Production).
CLUSTERUI_PUBLISHER_LEADS = envbool("CLUSTERUI_PUBLISHER_LEADS", True)
# Server processes freeze their start-up heap and collect young objects less often
# (common/gc_tuning.py): full garbage collections were the ingest's p99. false: Python's.
CLUSTERUI_GC_TUNING = envbool("CLUSTERUI_GC_TUNING", True)
# Slow GPU (healthchecks/slow_gpus.py): among a cluster's GPUs of one model at this
# utilization or more, with at least this many peers there, one whose SM clock stays below
# this share of their median for HOLD_S seconds gets slow_gpu; back above it for CLEAR_S,
# the event closes. A real H200 at full load runs 1365-1530 MHz (median 1462).
CLUSTERUI_SLOW_GPU_MIN_UTIL_PCT = envfloat("CLUSTERUI_SLOW_GPU_MIN_UTIL_PCT", 90.0)
CLUSTERUI_SLOW_GPU_CLOCK_RATIO = envfloat("CLUSTERUI_SLOW_GPU_CLOCK_RATIO", 0.85)
CLUSTERUI_SLOW_GPU_MIN_PEERS = envint("CLUSTERUI_SLOW_GPU_MIN_PEERS", 4)
CLUSTERUI_SLOW_GPU_HOLD_S = envfloat("CLUSTERUI_SLOW_GPU_HOLD_S", 60.0)
CLUSTERUI_SLOW_GPU_CLEAR_S = envfloat("CLUSTERUI_SLOW_GPU_CLEAR_S", 60.0)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": envstr("LOG_LEVEL", "INFO")},
    "loggers": {"daphne": {"level": "WARNING"}},
}
