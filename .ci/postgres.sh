#!/usr/bin/env bash
# Install (if needed) and start a local PostgreSQL server for the store conformance tests;
# prints the URL to use. Listens on 127.0.0.1 only.
#
# The caller captures stdout with $(...), which waits until every holder of the pipe has closed
# it. The server daemon would inherit it and keep it open for ever, so every tool here runs with
# stdout sent to stderr; only the final echo writes to it. The daemon's starter gets /dev/null
# for stderr too, so it cannot hold the caller's log open either.
set -euo pipefail
{
  if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  fi
  ver=$(ls /usr/lib/postgresql | sort -n | tail -1)
  if ! pg_lsclusters -h 2>/dev/null | grep -q "^$ver main"; then
    pg_createcluster "$ver" main >/dev/null
  fi
  pg_ctlcluster "$ver" main start >/dev/null 2>&1 || true
  for _ in $(seq 30); do pg_isready -q -h 127.0.0.1 && break; sleep 1; done
  su postgres -c "psql -q -c \"ALTER USER postgres PASSWORD 'postgres'\"" >/dev/null
} 1>&2 </dev/null
echo "postgresql://postgres:postgres@127.0.0.1:5432/postgres"
