#!/usr/bin/env bash
# The reconnect benchmark (bench/README.md): throwaway PostgreSQL and Redis (scripts/services.sh),
# production mode, then bench/reconnect/run.py with the arguments given.
#
#   bench/reconnect/run.sh [--nodes 4000] [--sample-hz 1]
#
# daphne runs on core 0; PostgreSQL, Redis and the driver (every agent connection) on core 1.
set -euo pipefail

cd "$(dirname "$0")/../.."
. bench/production.sh

if ! "$PY" -c 'import daphne, psutil, redis, websockets' 2>/dev/null; then
    echo "run.sh: .venv lacks daphne, psutil, redis or websockets; run 'make test' once" >&2
    exit 2
fi
bench_production_up
export BENCH_WORKDIR="var/bench/reconnect-$(date +%Y%m%d-%H%M%S)"   # logs, fleet, results
mkdir -p "$BENCH_WORKDIR"
log "machine: $(nproc) cores, $(free -h | awk '/^Mem:/ {print $2}') memory; uptime before the run: $(uptime)"
"${PIN[@]}" "$PY" bench/reconnect/run.py "$@"
log "uptime after the run: $(uptime)"
