#!/usr/bin/env bash
# Set up (idempotent, cached) and run lint plus the whole test suite. Usage: scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
# The suite runs over two pytest-xdist workers where the machine has two cores or more, each taking a
# whole test file at a time (a file's module fixtures, its jobs, made once): on two cores that ends in
# about three quarters of one process's time (docs/reference/testing.md). SAGEMAKER_DIST_TEST_WORKERS=N
# sets the count; 1 runs one plain process.
workers=${SAGEMAKER_DIST_TEST_WORKERS:-$(($(nproc) >= 2 ? 2 : 1))}
if [ "$workers" -ge 2 ] 2>/dev/null; then
  .venv/bin/python -m pytest -n "$workers" --dist loadfile "$@"
else
  .venv/bin/python -m pytest "$@"
fi
