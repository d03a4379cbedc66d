#!/usr/bin/env bash
# The ingest benchmark (bench/README.md): throwaway PostgreSQL and Redis (scripts/services.sh),
# production mode, then bench/ingest/run.py with the arguments given here.
#
#   bench/ingest/run.sh [--servers daphne,uvicorn,bare] [--processes 1,2] [--rates ...]
#
# PostgreSQL, Redis, the driver and the load generator run on core 1; the server on core 0.
set -euo pipefail

cd "$(dirname "$0")/../.."
. bench/production.sh

if ! "$PY" -c 'import uvicorn, uvloop, httptools, orjson, psutil, websockets' 2>/dev/null; then
    log "installing bench/ingest/requirements.txt"
    "$PY" -m pip install --quiet -r bench/ingest/requirements.txt
fi
bench_production_up
export BENCH_WORKDIR="var/bench/ingest-$(date +%Y%m%d-%H%M%S)"   # logs, profiles, results
mkdir -p "$BENCH_WORKDIR"
"${PIN[@]}" "$PY" bench/ingest/run.py "$@"
