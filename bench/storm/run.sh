#!/usr/bin/env bash
# The storm benchmark (bench/README.md): throwaway PostgreSQL and Redis (scripts/services.sh),
# production mode, then bench/storm/run.py with the arguments given.
#
#   bench/storm/run.sh [--nodes 2000] [--rates 100,200,500,1000,1500,2000] [--step-s 20]
#
# daphne runs on core 0; the Celery worker and beat, PostgreSQL, Redis and the driver (every
# agent connection) on core 1.
set -euo pipefail

cd "$(dirname "$0")/../.."
. bench/production.sh
bench_run storm bench/storm/run.py "$@"
