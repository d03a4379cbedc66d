# Sourced by the benchmarks' run.sh: a throwaway PostgreSQL and Redis (scripts/services.sh),
# stopped and removed again on exit, and production mode's environment pointed at them.
# Sets PY (the virtualenv's python; `make test` builds it) and, with bench_production_up,
# PIN: the command prefix that runs a process on core 1, off the server's core 0
# (PostgreSQL and Redis are moved there too), or nothing on a one-core machine.
#
#   . bench/production.sh; bench_production_up; "${PIN[@]}" "$PY" bench/x/run.py

PY=${PY:-.venv/bin/python}
if [ ! -x "$PY" ]; then
    echo "run.sh: $PY not found; run 'make test' once (it builds the virtualenv)" >&2
    exit 2
fi

. scripts/services.sh

bench_production_up() {
    missing=()
    services_missing_packages
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing missing Debian packages: ${missing[*]}"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
            --no-install-recommends "${missing[@]}"
    fi
    services_tmpdir
    trap _bench_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    services_start
    PIN=()
    if [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then
        # Off the server's core: Redis, and PostgreSQL with every process it forks later.
        # BENCH_DATABASE_CORE=0 puts PostgreSQL on the server's core instead: where the
        # driver keeps core 1 busy, the database then gets the share the server leaves.
        local pg_pid
        pg_pid=$(head -n 1 "$PGDATA/postmaster.pid")
        taskset -a -p -c 1 "$REDIS_PID" >/dev/null
        for pid in "$pg_pid" $(ps -o pid= --ppid "$pg_pid"); do
            taskset -a -p -c "${BENCH_DATABASE_CORE:-1}" "$pid" >/dev/null
        done
        PIN=(taskset -c 1)
    fi
    services_export_env
}

_bench_cleanup() {
    local status=$?
    trap '' INT TERM
    trap - EXIT
    set +e
    services_stop
    rm -rf "$TMP"
    exit "$status"
}

# What the fan-out, storm and reconnect benches' run.sh do: check the virtualenv, bring
# PostgreSQL and Redis up, make the run's folder (var/bench/NAME-<date>-<time>: logs,
# fleet, results), and run the driver on core 1 with the arguments given.
# bench_run_embedded does the same in embedded mode: no PostgreSQL or Redis, but SQLite
# files in the run's folder (data/), as `make demo` runs.
#
#   bench_run NAME DRIVER [ARGS...]
#   bench_run_embedded NAME DRIVER [ARGS...]
bench_run() {
    _bench_check_venv
    bench_production_up
    _bench_drive "$@"
}

bench_run_embedded() {
    _bench_check_venv
    PIN=()
    if [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then
        PIN=(taskset -c 1)
    fi
    export CLUSTERUI_MODE=embedded
    unset DATABASE_URL REDIS_URL CELERY_BROKER_URL
    _bench_drive "$@"
}

_bench_check_venv() {
    if ! "$PY" -c 'import daphne, psutil, redis, websockets' 2>/dev/null; then
        echo "run.sh: .venv lacks daphne, psutil, redis or websockets; run 'make test' once" >&2
        exit 2
    fi
}

_bench_drive() {
    local name=$1 driver=$2
    shift 2
    export BENCH_WORKDIR="var/bench/$name-$(date +%Y%m%d-%H%M%S)"
    mkdir -p "$BENCH_WORKDIR"
    if [ "${CLUSTERUI_MODE:-embedded}" = embedded ]; then
        export CLUSTERUI_DATA_DIR="$PWD/$BENCH_WORKDIR/data"
        mkdir -p "$CLUSTERUI_DATA_DIR"
    fi
    log "machine: $(nproc) cores, $(free -h | awk '/^Mem:/ {print $2}') memory; uptime before the run: $(uptime)"
    "${PIN[@]}" "$PY" "$driver" "$@"
    log "uptime after the run: $(uptime)"
}
