#!/usr/bin/env bash
# The console in embedded mode, with a seeded demo cluster:
#
#   make demo                      (builds .venv, then runs PY=.venv/bin/python scripts/demo.sh)
#   DEMO_RESET=1 make demo         (rebuilds the demo cluster's day of history first)
#
# Migrates the SQLite database, seeds the cluster "demo" and the accounts demo/demo
# (operator) and admin/admin (admin), then runs, as children of this script, a Celery
# worker and Celery beat (broker: settings.CELERY_BROKER_URL, a SQLite file under var/) and
# daphne on http://127.0.0.1:8000, and the simulated fleet (python -m agent.sim.fleet: 64 real
# agents on simulated H200s, state under var/fleet). Ctrl-C (or TERM) stops every child and waits for it; if
# one child dies, the others are stopped and the script exits non-zero. Safe to re-run.
set -euo pipefail

cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if [ ! -x "$PY" ]; then
    echo "demo.sh: $PY not found; run 'make demo' (it builds the virtualenv)" >&2
    exit 2
fi
# Started from a non-interactive shell in the background (`make demo &`), we inherit SIGINT
# ignored, and bash cannot trap a signal that was ignored on entry: start once more with
# SIGINT restored, so that Ctrl-C / SIGINT still stops everything.
if [ -n "$(trap -p INT)" ] && [ -z "${DEMO_SIGINT_RESTORED:-}" ]; then
    export DEMO_SIGINT_RESTORED=1
    exec "$PY" -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL);
os.execvp(sys.argv[1], sys.argv[1:])' bash "$PWD/scripts/demo.sh" "$@"
fi
export CLUSTERUI_MODE=embedded
export PYTHONUNBUFFERED=1
HOST=127.0.0.1
PORT=${DEMO_PORT:-8000}
RECEIVER_PORT=${DEMO_RECEIVER_PORT:-8025}
export CLUSTERUI_PUBLIC_URL=${CLUSTERUI_PUBLIC_URL:-http://$HOST:$PORT}
DATA_DIR=${CLUSTERUI_DATA_DIR:-var}

log() { printf '==> %s\n' "$*"; }

port_open() { (exec 3<>"/dev/tcp/$HOST/$PORT") 2>/dev/null; }

if port_open; then
    echo "demo.sh: something already listens on $HOST:$PORT; stop it first" >&2
    exit 1
fi

# Hashed, gzip and Brotli (about a minute: plotly.js at Brotli's best), again only when
# static/ or the installed packages (plotly.js, django-ninja's docs) changed since.
MANIFEST=staticfiles/staticfiles.json
INSTALLED_STAMP="$(dirname "$PY")/../.installed"
if [ ! -f "$MANIFEST" ] || [ -n "$(find static "$INSTALLED_STAMP" -newer "$MANIFEST" -print -quit 2>/dev/null)" ]; then
    log "collecting static files (hashed, gzip and Brotli)"
    "$PY" manage.py collectstatic --no-input -v 0
fi
log "migrating the database ($DATA_DIR/clusterui.sqlite3)"
"$PY" manage.py migrate --no-input -v 0
# The agent's wheelhouse (/agent/wheels/, the settings page's install command): built again
# when agent/ changed since. Without a package index the demo runs on, and the page says why.
WHEELHOUSE=${CLUSTERUI_AGENT_WHEELHOUSE:-$DATA_DIR/agent-wheels}
if [ ! -f "$WHEELHOUSE/manifest.json" ] || [ -n "$(find agent -newer "$WHEELHOUSE/manifest.json" -print -quit)" ]; then
    log "building the agent's wheelhouse ($WHEELHOUSE)"
    "$PY" manage.py build_agent_wheelhouse --targets all --dir "$WHEELHOUSE" >/dev/null \
        || log "no agent wheelhouse (is a package index reachable?): the install command is off"
fi
FLEET_DIR="$DATA_DIR/fleet"
RECEIVER_KEY="$DATA_DIR/demo-receiver/signing.key"
# The simulated Slurm (demo/slurm): sacct, squeue, scontrol and scancel answering from the
# fleet's jobs, first on the PATH of this script and its children only, never the machine's.
absolute() { case "$1" in /*) printf '%s' "$1" ;; *) printf '%s/%s' "$PWD" "${1#./}" ;; esac; }
export PATH="$PWD/demo/bin:$PATH"
DEMO_SLURM_PYTHON=$(absolute "$PY")
DEMO_SLURM_STATE=$(absolute "$FLEET_DIR/slurm.json")
export DEMO_SLURM_PYTHON DEMO_SLURM_STATE
export CLUSTERUI_JOBS_BACKFILL_DAYS=${CLUSTERUI_JOBS_BACKFILL_DAYS:-7}
log "seeding the demo cluster"
"$PY" manage.py seed_demo ${DEMO_RESET:+--reset} --fleet-dir "$FLEET_DIR" --import-jobs \
    --receiver-url "http://$HOST:$RECEIVER_PORT/clusterui" --receiver-key-file "$RECEIVER_KEY"

# Beat and the workers would each create the broker's queues as they start; on the SQLite
# broker one of them can lose that race and send nothing more (see the command's help).
log "declaring the task queues"
"$PY" manage.py declare_task_queues >/dev/null

# --- children --------------------------------------------------------------------------------
# Each child runs in its own process group, so the terminal's Ctrl-C reaches only this script,
# which then stops each group as a whole (the Celery worker's pool process goes with it).
names=()
pids=()
SETPGID='import os, sys; os.setpgid(0, 0); os.execvp(sys.argv[1], sys.argv[1:])'

start() {
    local name=$1
    shift
    "$PY" -c "$SETPGID" "$@" </dev/null &
    pids+=("$!")
    names+=("$name")
    log "started $name (pid $!)"
}

alive() { kill -0 "$1" 2>/dev/null; }

# A child's process group: the child and what it started (the worker's pool process).
group_alive() { kill -0 -- "-$1" 2>/dev/null; }
signal() {  # signal SIG PID: the child's group; the child itself if it has no group yet
    kill "-$1" -- "-$2" 2>/dev/null || { alive "$2" && kill "-$1" "$2" 2>/dev/null; } || true
}

stopping=0
stop_all() {
    local status=$1 i waited
    stopping=1
    trap '' INT TERM
    for i in "${!pids[@]}"; do
        # The child itself: a Celery worker stops its own pool (a TERM sent to the pool
        # process as well would be logged as a lost worker).
        if alive "${pids[$i]}"; then
            log "stopping ${names[$i]}"
            kill -TERM "${pids[$i]}" 2>/dev/null || true
        elif group_alive "${pids[$i]}"; then
            signal TERM "${pids[$i]}"
        fi
    done
    # A Celery worker finishes its current task first; give each group 20 s, then KILL it.
    for waited in $(seq 1 40); do
        local any=0
        for i in "${!pids[@]}"; do
            if group_alive "${pids[$i]}" || alive "${pids[$i]}"; then any=1; fi
        done
        [ "$any" -eq 0 ] && break
        sleep 0.5
    done
    for i in "${!pids[@]}"; do
        if group_alive "${pids[$i]}" || alive "${pids[$i]}"; then
            log "${names[$i]} did not stop; killing it"
            signal KILL "${pids[$i]}"
        fi
        wait "${pids[$i]}" 2>/dev/null || true
    done
    log "stopped"
    exit "$status"
}

trap 'stop_all 130' INT
trap 'stop_all 143' TERM
trap '[ "$stopping" -eq 1 ] || [ "${#pids[@]}" -eq 0 ] || stop_all 1' EXIT

# One worker for the periodic sweeps (heartbeats, node states, due repair steps) alone, so
# that they never wait behind other work; one for the rest (clusterui/settings.py's queues;
# production gives the recommender a worker of its own too).
start sweeps "$PY" -m celery -A clusterui worker --loglevel=WARNING --concurrency=1 \
    --queues sweeps --hostname "sweeps@%h"
start worker "$PY" -m celery -A clusterui worker --loglevel=WARNING --concurrency=1 \
    --queues celery,recommend,provider,notify --hostname "worker@%h"
start beat "$PY" -m celery -A clusterui beat --loglevel=WARNING \
    --schedule "$DATA_DIR/celerybeat-schedule"
# The notification receiver the seeded channel "demo receiver" posts its signed webhooks to.
start receiver "$PY" scripts/demo_receiver.py --port "$RECEIVER_PORT" --key-file "$RECEIVER_KEY" \
    --log "$DATA_DIR/notifications.log"
# A listen backlog of 4,096, not Twisted's 50: a fleet connecting at once does not fill it
# and have its connections, and a person's, retried a second later (README.md).
start daphne "$PY" -m daphne -e "tcp:port=$PORT:interface=$HOST:backlog=4096" \
    clusterui.asgi:application

for _ in $(seq 1 60); do
    port_open && break
    alive "${pids[4]}" || break
    sleep 0.5
done

# The simulated fleet: one real agent per demo node (simulated H200s), in one process.
start fleet "$PY" -m agent.sim.fleet --server "ws://$HOST:$PORT/ws/agent/" --state-dir "$FLEET_DIR" \
    --names 'gpu-{:03d}' --count 64 --slurm-state "$DEMO_SLURM_STATE"

if port_open; then
    cat <<EOF

    clusterui is running: http://$HOST:$PORT/

    sign in as  demo  / demo    (operator)
             or admin / admin   (admin)

    64 simulated agents report live; in a minute or two gpu-040 throttles (thermal)
    and gpu-012 loses GPU 3 (Xid 79). Notifications of them (a signed webhook
    to a local receiver) land in $DATA_DIR/notifications.log.
    Ctrl-C stops the console, the agents, the Celery worker and beat.

EOF
fi

# Watch the children: when one dies, stop the others and fail.
while :; do
    for i in "${!pids[@]}"; do
        if ! alive "${pids[$i]}"; then
            status=0
            wait "${pids[$i]}" || status=$?
            echo "demo.sh: ${names[$i]} exited (status $status); stopping the rest" >&2
            stop_all 1
        fi
    done
    sleep 1
done
