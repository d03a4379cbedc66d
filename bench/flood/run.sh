#!/usr/bin/env bash
# The flood benchmark (bench/README.md): throwaway PostgreSQL and Redis (scripts/services.sh),
# production mode, then bench/flood/run.py with the arguments given.
#
#   bench/flood/run.sh [--nodes 500] [--phase-s 60]
set -euo pipefail

cd "$(dirname "$0")/../.."
. bench/production.sh
bench_run flood bench/flood/run.py "$@"
