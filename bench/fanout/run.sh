#!/usr/bin/env bash
# The browser fan-out benchmark (bench/README.md): throwaway PostgreSQL and Redis
# (scripts/services.sh), production mode, then bench/fanout/run.py with the arguments given.
#
#   bench/fanout/run.sh [--sockets 50,100,200] [--seconds 90] [--nodes 2000] [--out FILE]
#
# As bench/ingest/run.sh: PostgreSQL, Redis, the driver (browsers and the event node) and the
# load generator run on core 1; the one daphne process on core 0.
set -euo pipefail

cd "$(dirname "$0")/../.."
. bench/production.sh

if ! "$PY" -c 'import daphne, psutil, redis, websockets' 2>/dev/null; then
    echo "run.sh: .venv lacks daphne, psutil, redis or websockets; run 'make test' once" >&2
    exit 2
fi
bench_production_up
export BENCH_WORKDIR="var/bench/fanout-$(date +%Y%m%d-%H%M%S)"   # logs, fleet, results
mkdir -p "$BENCH_WORKDIR"
log "machine: $(nproc) cores, $(free -h | awk '/^Mem:/ {print $2}') memory; uptime before the run: $(uptime)"
"${PIN[@]}" "$PY" bench/fanout/run.py "$@"
log "uptime after the run: $(uptime)"
