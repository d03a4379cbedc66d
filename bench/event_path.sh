#!/usr/bin/env bash
# The event path's cost without the sockets (bench/event_path.py): a throwaway PostgreSQL
# (bench/production.sh), or SQLite in the run's folder with --embedded.
#
#   bench/event_path.sh [--embedded] [--nodes 2000] [--batches 200,50,10,1] [--profile]
set -euo pipefail

cd "$(dirname "$0")/.."
. bench/production.sh
if [ "${1:-}" = --embedded ]; then
    shift
    bench_run_embedded event-path bench/event_path.py "$@"
else
    bench_run event-path bench/event_path.py "$@"
fi
