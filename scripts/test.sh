#!/usr/bin/env bash
# The whole test suite: unit tests, then integration tests against a real PostgreSQL
# (the local server on 127.0.0.1:5432 plus throwaway clusters started by the tests).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --workspace --all-targets
cargo test --workspace -- --test-threads="${PGMEMO_TEST_THREADS:-4}"
