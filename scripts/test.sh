#!/usr/bin/env bash
# The whole test suite against throwaway services: PostgreSQL, Redis and headless Chromium.
#
#   PY=.venv/bin/python scripts/test.sh [pytest args]     (what `make test` runs)
#
# Installs what is missing from Debian (postgresql, redis-server, chromium, Slurm, Node.js) and
# the npm package of the sign-in tests' OpenID Connect provider, starts a
# private PostgreSQL and Redis on free loopback ports in a temporary directory
# (scripts/services.sh), runs collectstatic and pytest in production mode, and removes
# everything again on exit (also when the tests fail or on Ctrl-C). Exits with pytest's status.
set -euo pipefail

cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if [ ! -x "$PY" ]; then
    echo "test.sh: $PY not found; run 'make test' (it builds the virtualenv)" >&2
    exit 2
fi

. scripts/services.sh

# --- Debian packages ---------------------------------------------------------------------
missing=()
services_missing_packages
[ -x /usr/bin/chromium ] || missing+=(chromium fonts-liberation)  # readable screenshots
# shellcheck validates startup scripts on save (nodes/scripts.py).
command -v shellcheck >/dev/null || missing+=(shellcheck)
command -v promtool >/dev/null || missing+=(prometheus)  # promtool checks /metrics and the rules
command -v ss >/dev/null || missing+=(iproute2)  # ss reads a listening socket's backlog
# A real Slurm cluster with accounting for the Slurm tests (tests/slurm.py starts it).
for program in munged slurmctld slurmd scontrol slurmdbd mariadbd; do
    if ! command -v "$program" >/dev/null && [ ! -x "/usr/sbin/$program" ]; then
        missing+=(munge slurmctld slurmd slurm-client slurmdbd mariadb-server)
        break
    fi
done
# Node.js and npm for the sign-in tests' OpenID Connect provider (below).
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    missing+=(nodejs npm)
fi
if [ ${#missing[@]} -gt 0 ]; then
    log "installing missing Debian packages: ${missing[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        "${missing[@]}"
fi

# --- The sign-in tests' OpenID Connect provider: the npm package oidc-provider ------------
# Installed as tests/oidc/package-lock.json pins it, into OIDC_PROVIDER_DIR (read by
# tests/oidc/provider.py); again only when the lock file changed.
export OIDC_PROVIDER_DIR=${OIDC_PROVIDER_DIR:-$PWD/.venv/oidc-provider}
if ! cmp -s tests/oidc/package-lock.json "$OIDC_PROVIDER_DIR/installed-package-lock.json"; then
    log "npm ci: oidc-provider into $OIDC_PROVIDER_DIR"
    mkdir -p "$OIDC_PROVIDER_DIR"
    cp tests/oidc/package.json tests/oidc/package-lock.json "$OIDC_PROVIDER_DIR/"
    (cd "$OIDC_PROVIDER_DIR" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
    cp tests/oidc/package-lock.json "$OIDC_PROVIDER_DIR/installed-package-lock.json"
fi

# --- Temporary directory, and cleanup on exit --------------------------------------------
services_tmpdir

cleanup() {
    local status=$?
    # Finish cleaning up even if Ctrl-C comes again now (the commands below inherit this).
    trap '' INT TERM
    trap - EXIT
    set +e
    services_stop
    rm -rf "$TMP"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- PostgreSQL and Redis ----------------------------------------------------------------
services_start

# --- Environment: production mode against the throwaway services -------------------------
services_export_env
log "environment: CLUSTERUI_MODE=$CLUSTERUI_MODE DATABASE_URL=$DATABASE_URL REDIS_URL=$REDIS_URL"

log "collectstatic"
"$PY" manage.py collectstatic --noinput -v0

# The agent's wheelhouse, as an install builds it (every target Python and machine), while
# the package index is reachable: the install tests serve it on loopback and nothing else.
export CLUSTERUI_AGENT_WHEELHOUSE="$TMP/agent-wheels"
log "build_agent_wheelhouse into $CLUSTERUI_AGENT_WHEELHOUSE"
"$PY" manage.py build_agent_wheelhouse --targets all -v0 > /dev/null

# A hung test must not eat CI's whole time limit: after TEST_HANG_DUMP_S in one test pytest
# prints every thread's stack; after TEST_TIMEOUT_S in all pytest gets SIGINT (it prints
# what ran and where it stood), and SIGKILL a minute later. Later -o options win.
log "pytest $* (whole-run limit ${TEST_TIMEOUT_S:=4200} s)"
set +e
timeout --foreground -s INT -k 60 "$TEST_TIMEOUT_S" \
    "$PY" -m pytest -o faulthandler_timeout="${TEST_HANG_DUMP_S:-300}" "$@"
status=$?
set -e
case "$status" in
    5) echo "test.sh: pytest collected no tests; counting that as a failure" >&2 ;;
    124) echo "test.sh: pytest ran past TEST_TIMEOUT_S=$TEST_TIMEOUT_S s and was stopped" >&2 ;;
    137) echo "test.sh: pytest was killed (SIGKILL; after TEST_TIMEOUT_S if it ignored SIGINT)" >&2 ;;
esac
if [ "$status" != 0 ] && grep -q -E "still waiting|deadlock detected" "$PGROOT/postgresql.log"; then
    echo "test.sh: PostgreSQL saw these lock waits:" >&2
    grep -E -A3 "still waiting|deadlock detected" "$PGROOT/postgresql.log" | tail -n 60 >&2
fi
exit "$status"
