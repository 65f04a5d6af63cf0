#!/bin/sh
# A scheduler of which exactly one copy may be active: run it on every machine as
#   permit elect scheduler --value "$(hostname)" -- ./examples/scheduler.sh
# Only the leader's copy runs. `permit elect` gives it the leadership's fencing token in
# PERMIT_TOKEN: jobs it starts carry that token, so that what they touch can refuse a deposed
# leader's late writes. It runs until SIGTERM (leadership lost, or Ctrl-C on `permit elect`).
set -eu

if [ -z "${PERMIT_TOKEN:-}" ]; then
    echo "scheduler.sh: no PERMIT_TOKEN; run me as: permit elect scheduler --value NAME -- $0" >&2
    exit 64
fi

sleeper=
trap 'kill $sleeper 2>/dev/null || true; echo "scheduler.sh: stopping (leadership of ${PERMIT_ELECTION:-?} ends)"; exit 0' TERM INT
echo "scheduler.sh: leading ${PERMIT_ELECTION:-?} with fencing token $PERMIT_TOKEN"
tick=0
while :; do
    tick=$((tick + 1))
    echo "scheduler.sh: tick $tick: starting due jobs with fencing token $PERMIT_TOKEN"
    # `wait` returns as soon as a signal arrives, where a foreground `sleep` would delay the trap.
    sleep 10 &
    sleeper=$!
    wait $sleeper || true
done
