#!/usr/bin/env bash
# The storm benchmark in embedded mode (bench/README.md): SQLite, the in-memory channel
# layer and the SQLite Celery broker in the run's folder, as `make demo` runs; then
# bench/storm/run.py with the arguments given (issue 14's embedded target: 1,000 nodes,
# 200 events/s).
#
#   bench/storm/embedded.sh [--nodes 1000] [--rates 100,200,300]
#
# daphne runs on core 0; the workers, the beat and the driver on core 1.
set -euo pipefail

cd "$(dirname "$0")/../.."
. bench/production.sh
bench_run_embedded storm-embedded bench/storm/run.py "$@"
