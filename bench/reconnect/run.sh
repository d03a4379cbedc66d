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
bench_run reconnect bench/reconnect/run.py "$@"
