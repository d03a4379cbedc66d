#!/usr/bin/env bash
# The fuzz run (bench/README.md): throwaway PostgreSQL and Redis (scripts/services.sh),
# production mode, then bench/fuzz/run.py with the arguments given.
#
#   bench/fuzz/run.sh [--frames 10000] [--seed N] [--types hello,sample,event,...]
set -euo pipefail

cd "$(dirname "$0")/../.."
. bench/production.sh
bench_run fuzz bench/fuzz/run.py "$@"
