#!/bin/sh
# A database migration that must never run twice at once: run it under a permit,
#   permit run db.orders -n 2 -- ./examples/migrate.sh
# `permit run` gives it the fencing token of its hold in PERMIT_TOKEN. A real migration passes
# that token with every write, so that the database can refuse a write that carries an older
# token than one it has already seen (a holder whose lease ran out while it was paused).
set -eu

if [ -z "${PERMIT_TOKEN:-}" ]; then
    echo "migrate.sh: no PERMIT_TOKEN; run me as: permit run db.orders -- $0" >&2
    exit 64
fi

echo "migrate.sh: holding ${PERMIT_PERMITS:-?} permit(s) of ${PERMIT_SEMAPHORE:-?} with fencing token $PERMIT_TOKEN"
for step in "add column orders.region" "copy orders.country to orders.region" "index orders.region"; do
    echo "migrate.sh: $step (fencing token $PERMIT_TOKEN)"
done
echo "migrate.sh: done; permit releases the hold when this script exits"
