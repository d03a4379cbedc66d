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
bench_run fanout bench/fanout/run.py "$@"
