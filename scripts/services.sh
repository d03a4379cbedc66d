# Throwaway PostgreSQL and Redis on free loopback ports in a temporary directory.
# Sourced (not run) by scripts/test.sh and bench/ingest/run.sh:
#
#   PY=.venv/bin/python; . scripts/services.sh
#   missing=(); services_missing_packages; ...apt-get install "${missing[@]}"...
#   trap '...; services_stop; rm -rf "$TMP"' EXIT
#   services_start              # PostgreSQL on $PG_PORT, Redis on $REDIS_PORT, under $TMP
#   services_export_env         # production mode against them
#
# Needs PY (a Python). Defines `log` and `as_root` for its callers too. Sets TMP, PGBIN,
# PGROOT, PGDATA, PG_PORT, PG_STARTED, REDIS_PORT and REDIS_PID.

log() { printf '==> %s\n' "$*"; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null; then
        sudo "$@"
    else
        echo "$(basename "$0"): need root to run: $*" >&2
        return 1
    fi
}

pg_bindir() {
    # The newest installed server, e.g. /usr/lib/postgresql/15/bin.
    local dir
    dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    if [ -n "$dir" ] && [ -x "$dir/initdb" ]; then
        echo "$dir"
    fi
}

# Appends the Debian packages the services need and lack to the caller's `missing` array.
services_missing_packages() {
    [ -n "$(pg_bindir)" ] || missing+=(postgresql)
    command -v redis-server >/dev/null || missing+=(redis-server)
}

free_port() {
    "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

as_pg_user() {
    # initdb and postgres refuse to run as root: run them as the postgres system user.
    if [ "$(id -u)" -eq 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

# The temporary directory, in /tmp, not $TMPDIR: the postgres user must reach it, and a
# unix socket path is short. Call before setting the EXIT trap that removes it.
services_tmpdir() {
    PGBIN=$(pg_bindir)
    if [ -z "$PGBIN" ]; then
        echo "$(basename "$0"): no PostgreSQL server found under /usr/lib/postgresql" >&2
        exit 2
    fi
    TMP=$(mktemp -d /tmp/clusterui-test.XXXXXX)
    PGROOT="$TMP/pg"   # owned by the postgres user: data, socket and log
    PGDATA="$PGROOT/data"
    REDIS_PID=""
    PG_STARTED=""
}

# Stops what services_start started (call it from the EXIT trap; it never fails).
services_stop() {
    if [ -n "$REDIS_PID" ] && kill -0 "$REDIS_PID" 2>/dev/null; then
        log "stopping redis (pid $REDIS_PID)"
        kill "$REDIS_PID"
        for _ in $(seq 50); do kill -0 "$REDIS_PID" 2>/dev/null || break; sleep 0.1; done
    fi
    if [ -n "$PG_STARTED" ]; then
        log "stopping postgresql"
        as_pg_user "$PGBIN/pg_ctl" stop -D "$PGDATA" -m fast -s
    fi
}

services_start() {
    # --- PostgreSQL ----------------------------------------------------------------------
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
    cat >"$PGDATA/pg_hba.conf" <<'HBA'
# Throwaway test server: trust, and only over the unix socket and loopback.
local all all              trust
host  all all 127.0.0.1/32 trust
HBA
    cat >>"$PGDATA/postgresql.conf" <<CONF

# scripts/test.sh: a throwaway server, tuned for speed over durability.
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$PGROOT'
fsync = off
full_page_writes = off
synchronous_commit = off
max_connections = 100
# A test stuck on a lock leaves its cause in the log: test.sh prints these lines on a failure.
log_lock_waits = on
log_line_prefix = '%m [%p] %a: '
CONF
    log "postgresql: starting on 127.0.0.1:$PG_PORT (log: $PGROOT/postgresql.log)"
    if ! as_pg_user "$PGBIN/pg_ctl" start -D "$PGDATA" -w -t 60 -s -l "$PGROOT/postgresql.log"; then
        cat "$PGROOT/postgresql.log" >&2
        exit 1
    fi
    PG_STARTED=1
    "$PGBIN/psql" -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -q -v ON_ERROR_STOP=1 \
        -c "CREATE ROLE clusterui LOGIN CREATEDB" \
        -c "CREATE DATABASE clusterui OWNER clusterui"

    # --- Redis ---------------------------------------------------------------------------
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
        echo "$(basename "$0"): redis-server did not start" >&2
        cat "$TMP/redis/redis.log" >&2 || true
        exit 1
    fi
    if ! "$PY" - "$REDIS_PORT" <<'PING'
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
PING
    then
        cat "$TMP/redis/redis.log" >&2 || true
        exit 1
    fi
}

# Production mode against the throwaway services.
services_export_env() {
    export CLUSTERUI_MODE=production
    export DATABASE_URL="postgres://clusterui@127.0.0.1:$PG_PORT/clusterui"
    export REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
    SECRET_KEY=$("$PY" -c 'import secrets, string; a = string.ascii_letters + string.digits; print("".join(secrets.choice(a) for _ in range(64)))')
    export SECRET_KEY
    # The secrets store's key (clusters/secret_store.py): a Fernet key, new for each run.
    CLUSTERUI_SECRETS_KEYS=$("$PY" -c 'import base64, os; print(base64.urlsafe_b64encode(os.urandom(32)).decode())')
    export CLUSTERUI_SECRETS_KEYS
    export ALLOWED_HOSTS=127.0.0.1,localhost,testserver
    # Everything here speaks plain http on loopback: no redirect to https.
    export SECURE_SSL_REDIRECT=false
    unset DATABASE_URL_FILE REDIS_URL_FILE SECRET_KEY_FILE CELERY_BROKER_URL CLUSTERUI_SECRETS_KEYS_FILE
}
