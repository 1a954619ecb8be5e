#!/usr/bin/env bash
# The whole test suite: unit tests, then integration tests against a real PostgreSQL
# (the local server on 127.0.0.1:5432 plus throwaway clusters started by the tests).
# Ends with one summary line over every test binary: "N passed, N failed, N skipped".
set -uo pipefail
cd "$(dirname "$0")/.."
cargo build --workspace --all-targets || exit 1
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
cargo test --workspace --no-fail-fast -- --test-threads="${PGMEMO_TEST_THREADS:-4}" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
awk '/^test result:/ { p += $4; f += $6; i += $8 } END { printf "%d passed, %d failed, %d skipped\n", p, f, i }' "$log"
exit "$status"
