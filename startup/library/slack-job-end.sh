#!/bin/bash
# A Slack message at job end: the job's id, user, name and exit code, to the incoming
# webhook in the secret SLACK_WEBHOOK_URL (Secrets page). Never fails the job's epilog.
set -uo pipefail
if [ -z "${SLACK_WEBHOOK_URL:-}" ]; then
    echo "no SLACK_WEBHOOK_URL secret: nothing sent"
    exit 0
fi
text="Job ${SLURM_JOB_ID:-?} (${SLURM_JOB_NAME:-?}) of ${SLURM_JOB_USER:-?} ended on $(hostname -s), exit code ${SLURM_JOB_EXIT_CODE:-?}"
payload=$(printf '{"text": "%s"}' "${text//\"/\\\"}")
curl --silent --show-error --max-time 10 -H 'Content-Type: application/json' \
    -d "$payload" "$SLACK_WEBHOOK_URL" || echo "Slack did not take the message"
exit 0
