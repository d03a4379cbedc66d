#!/usr/bin/env bash
# The ingest benchmark (bench/README.md): throwaway PostgreSQL and Redis (scripts/services.sh),
# production mode, then bench/ingest/run.py with the arguments given here.
#
#   bench/ingest/run.sh [--servers daphne,uvicorn,bare] [--processes 1,2] [--rates ...]
#
# PostgreSQL, Redis, the driver and the load generator run on core 1; the server on core 0.
set -euo pipefail

cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
if [ ! -x "$PY" ]; then
    echo "run.sh: $PY not found; run 'make test' once (it builds the virtualenv)" >&2
    exit 2
fi

. scripts/services.sh

missing=()
services_missing_packages
if [ ${#missing[@]} -gt 0 ]; then
    log "installing missing Debian packages: ${missing[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        "${missing[@]}"
fi
if ! "$PY" -c 'import uvicorn, uvloop, httptools, orjson, psutil, websockets' 2>/dev/null; then
    log "installing bench/ingest/requirements.txt"
    "$PY" -m pip install --quiet -r bench/ingest/requirements.txt
fi

services_tmpdir
cleanup() {
    local status=$?
    trap '' INT TERM
    trap - EXIT
    set +e
    services_stop
    rm -rf "$TMP"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

services_start
if [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then
    # Off the server's core: Redis, and PostgreSQL with every process it forks later.
    pg_pid=$(head -n 1 "$PGDATA/postmaster.pid")
    for pid in "$REDIS_PID" "$pg_pid" $(ps -o pid= --ppid "$pg_pid"); do
        taskset -a -p -c 1 "$pid" >/dev/null
    done
    PIN=(taskset -c 1)
else
    PIN=()
fi
services_export_env
export BENCH_WORKDIR="var/bench/ingest-$(date +%Y%m%d-%H%M%S)"   # logs, profiles, results
mkdir -p "$BENCH_WORKDIR"
"${PIN[@]}" "$PY" bench/ingest/run.py "$@"
