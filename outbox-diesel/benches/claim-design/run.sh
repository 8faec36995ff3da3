#!/usr/bin/env bash
# Measures the database side of the two claim designs with pgbench, on an
# outbox_events table built by the crate's own DDL:
#   (a) one transaction: claim 100 rows FOR UPDATE SKIP LOCKED, mark them sent, COMMIT
#       (one write and one commit per batch);
#   (b) committed lease: claim 100 rows by setting locked_by/locked_until (COMMIT),
#       then mark the holder's rows sent (second write, second COMMIT).
# Prints rows marked per second for each, with 1 and 2 concurrent claimers.
# `run.sh notify` measures the cost of NOTIFY on recording: commits/s of
# one-event transactions with and without pg_notify, 1 and 8 writers.
# Usage: outbox-diesel/benches/claim-design/run.sh   (needs psql, pgbench, a local PostgreSQL)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
PGURL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
ROWS=${ROWS:-200000}
DURATION=${DURATION:-15}
psql_q() { psql "$PGURL" -v ON_ERROR_STOP=1 -qAt "$@"; }

setup() {
  psql_q -c "SET client_min_messages = warning; DROP SCHEMA IF EXISTS claim_bench CASCADE" >/dev/null
  psql_q -c "CREATE SCHEMA claim_bench"
  sed 's/{schema}/claim_bench/g' "$here/../../sql/001_outbox.sql" | psql_q >/dev/null
  psql_q -c "ALTER TABLE claim_bench.outbox_events ADD COLUMN locked_by integer, ADD COLUMN locked_until timestamptz"
  psql_q -c "INSERT INTO claim_bench.outbox_events (id, aggregate_type, aggregate_id, event_type, schema_version, payload, occurred_at)
             SELECT gen_random_uuid(), 'order', (g % 2000)::text, 'order.placed', 1,
                    '{\"order_id\": 1, \"total_cents\": 1250}', now()
             FROM generate_series(1, $ROWS) g"
  psql_q -c "VACUUM ANALYZE claim_bench.outbox_events"
}

run() { # design clients
  setup
  local out
  out=$(pgbench "$PGURL" -n -M prepared -c "$2" -j "$2" -T "$DURATION" -f "$here/$1.sql" 2>&1)
  local tps
  tps=$(grep -oP 'tps = \K[0-9.]+' <<<"$out" | head -1)
  printf '%-6s clients=%s  batches/s=%8.1f  rows/s=%9.0f\n' "$1" "$2" "$tps" "$(echo "$tps * 100" | bc)"
}

record() { # script clients: one event per transaction
  ROWS=0 setup
  local tps
  tps=$(pgbench "$PGURL" -n -M prepared -c "$2" -j "$2" -T "$DURATION" -f "$here/$1.sql" 2>&1 |
    grep -oP 'tps = \K[0-9.]+' | head -1)
  printf '%-14s clients=%s  commits/s=%8.1f\n' "$1" "$2" "$tps"
}

case "${1:-all}" in
  claim | all)
    for clients in 1 2; do
      run a "$clients"
      run b "$clients"
    done ;;&
  notify | all)
    for clients in 1 8; do
      record record_plain "$clients"
      record record_notify "$clients"
    done ;;
esac
psql_q -c "SET client_min_messages = warning; DROP SCHEMA claim_bench CASCADE" >/dev/null
psql_q -c "SHOW synchronous_commit" | sed 's/^/synchronous_commit=/'
