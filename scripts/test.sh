#!/usr/bin/env bash
# The whole test suite against throwaway services: PostgreSQL, Redis and headless Chromium.
#
#   PY=.venv/bin/python scripts/test.sh [pytest args]     (what `make test` runs)
#
# Installs what is missing from Debian (postgresql, redis-server, chromium), starts a
# private PostgreSQL and Redis on free loopback ports in a temporary directory, runs
# collectstatic and pytest in production mode, and removes everything again on exit
# (also when the tests fail or on Ctrl-C). Exits with pytest's status.
set -euo pipefail

cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if [ ! -x "$PY" ]; then
    echo "test.sh: $PY not found; run 'make test' (it builds the virtualenv)" >&2
    exit 2
fi

log() { printf '==> %s\n' "$*"; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null; then
        sudo "$@"
    else
        echo "test.sh: need root to run: $*" >&2
        return 1
    fi
}

# --- Debian packages ---------------------------------------------------------------------
pg_bindir() {
    # The newest installed server, e.g. /usr/lib/postgresql/15/bin.
    local dir
    dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    if [ -n "$dir" ] && [ -x "$dir/initdb" ]; then
        echo "$dir"
    fi
}

missing=()
[ -n "$(pg_bindir)" ] || missing+=(postgresql)
command -v redis-server >/dev/null || missing+=(redis-server)
[ -x /usr/bin/chromium ] || missing+=(chromium fonts-liberation)  # readable screenshots
if [ ${#missing[@]} -gt 0 ]; then
    log "installing missing Debian packages: ${missing[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        "${missing[@]}"
fi
PGBIN=$(pg_bindir)
if [ -z "$PGBIN" ]; then
    echo "test.sh: no PostgreSQL server found under /usr/lib/postgresql" >&2
    exit 2
fi

free_port() {
    "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# --- Temporary directory, and cleanup on exit --------------------------------------------
# In /tmp, not $TMPDIR: the postgres user must reach it, and a unix socket path is short.
TMP=$(mktemp -d /tmp/clusterui-test.XXXXXX)
PGROOT="$TMP/pg"   # owned by the postgres user: data, socket and log
PGDATA="$PGROOT/data"
REDIS_PID=""
PG_STARTED=""

as_pg_user() {
    # initdb and postgres refuse to run as root: run them as the postgres system user.
    if [ "$(id -u)" -eq 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

cleanup() {
    local status=$?
    # Finish cleaning up even if Ctrl-C comes again now (the commands below inherit this).
    trap '' INT TERM
    trap - EXIT
    set +e
    if [ -n "$REDIS_PID" ] && kill -0 "$REDIS_PID" 2>/dev/null; then
        log "stopping redis (pid $REDIS_PID)"
        kill "$REDIS_PID"
        for _ in $(seq 50); do kill -0 "$REDIS_PID" 2>/dev/null || break; sleep 0.1; done
    fi
    if [ -n "$PG_STARTED" ]; then
        log "stopping postgresql"
        as_pg_user "$PGBIN/pg_ctl" stop -D "$PGDATA" -m fast -s
    fi
    rm -rf "$TMP"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- PostgreSQL --------------------------------------------------------------------------
PG_PORT=$(free_port)
if [ "$(id -u)" -eq 0 ]; then
    chmod 755 "$TMP"   # the postgres user must reach its data directory
fi
mkdir -p "$PGROOT"
if [ "$(id -u)" -eq 0 ]; then
    chown postgres: "$PGROOT"
fi
log "postgresql: initdb in $PGDATA ($PGBIN)"
as_pg_user "$PGBIN/initdb" -D "$PGDATA" -U postgres --auth=trust --encoding=UTF8 \
    --no-locale --no-sync >"$TMP/initdb.log" 2>&1 \
    || { cat "$TMP/initdb.log" >&2; exit 1; }
cat >"$PGDATA/pg_hba.conf" <<'EOF'
# Throwaway test server: trust, and only over the unix socket and loopback.
local all all              trust
host  all all 127.0.0.1/32 trust
EOF
cat >>"$PGDATA/postgresql.conf" <<EOF

# scripts/test.sh: a throwaway server, tuned for speed over durability.
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$PGROOT'
fsync = off
full_page_writes = off
synchronous_commit = off
max_connections = 100
EOF
log "postgresql: starting on 127.0.0.1:$PG_PORT (log: $PGROOT/postgresql.log)"
if ! as_pg_user "$PGBIN/pg_ctl" start -D "$PGDATA" -w -t 60 -s -l "$PGROOT/postgresql.log"; then
    cat "$PGROOT/postgresql.log" >&2
    exit 1
fi
PG_STARTED=1
"$PGBIN/psql" -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -q -v ON_ERROR_STOP=1 \
    -c "CREATE ROLE clusterui LOGIN CREATEDB" \
    -c "CREATE DATABASE clusterui OWNER clusterui"

# --- Redis -------------------------------------------------------------------------------
REDIS_PORT=$(free_port)
mkdir -p "$TMP/redis"
log "redis: starting on 127.0.0.1:$REDIS_PORT (no persistence, log: $TMP/redis/redis.log)"
redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$TMP/redis" \
    --save '' --appendonly no --daemonize yes \
    --pidfile "$TMP/redis/redis.pid" --logfile "$TMP/redis/redis.log"
for _ in $(seq 100); do
    [ -s "$TMP/redis/redis.pid" ] && break
    sleep 0.1
done
REDIS_PID=$(cat "$TMP/redis/redis.pid" 2>/dev/null || true)
if [ -z "$REDIS_PID" ]; then
    echo "test.sh: redis-server did not start" >&2
    cat "$TMP/redis/redis.log" >&2 || true
    exit 1
fi
if ! "$PY" - "$REDIS_PORT" <<'EOF'
import socket, sys, time
deadline = time.monotonic() + 15
while True:
    try:
        with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1) as s:
            s.sendall(b"PING\r\n")
            if s.recv(16).startswith(b"+PONG"):
                break
    except OSError:
        pass
    if time.monotonic() > deadline:
        sys.exit("redis did not answer PING within 15 s")
    time.sleep(0.1)
EOF
then
    cat "$TMP/redis/redis.log" >&2 || true
    exit 1
fi

# --- Environment: production mode against the throwaway services -------------------------
export CLUSTERUI_MODE=production
export DATABASE_URL="postgres://clusterui@127.0.0.1:$PG_PORT/clusterui"
export REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
SECRET_KEY=$("$PY" -c 'import secrets, string; a = string.ascii_letters + string.digits; print("".join(secrets.choice(a) for _ in range(64)))')
export SECRET_KEY
export ALLOWED_HOSTS=127.0.0.1,localhost,testserver
unset DATABASE_URL_FILE REDIS_URL_FILE SECRET_KEY_FILE CELERY_BROKER_URL
log "environment: CLUSTERUI_MODE=$CLUSTERUI_MODE DATABASE_URL=$DATABASE_URL REDIS_URL=$REDIS_URL"

log "collectstatic"
"$PY" manage.py collectstatic --noinput -v0

# A hung test must not eat CI's whole time limit: after TEST_HANG_DUMP_S in one test pytest
# prints every thread's stack; after TEST_TIMEOUT_S in all pytest gets SIGINT (it prints
# what ran and where it stood), and SIGKILL a minute later. Later -o options win.
log "pytest $* (whole-run limit ${TEST_TIMEOUT_S:=4200} s)"
set +e
timeout --foreground -s INT -k 60 "$TEST_TIMEOUT_S" \
    "$PY" -m pytest -o faulthandler_timeout="${TEST_HANG_DUMP_S:-300}" "$@"
status=$?
set -e
case "$status" in
    5) echo "test.sh: pytest collected no tests; counting that as a failure" >&2 ;;
    124) echo "test.sh: pytest ran past TEST_TIMEOUT_S=$TEST_TIMEOUT_S s and was stopped" >&2 ;;
    137) echo "test.sh: pytest was killed (SIGKILL; after TEST_TIMEOUT_S if it ignored SIGINT)" >&2 ;;
esac
exit "$status"
