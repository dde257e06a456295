#!/usr/bin/env bash
# Set up (idempotent, cached) and run lint plus the whole test suite. Usage: scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
# SAGEMAKER_DIST_TEST_WORKERS=N (N >= 2) spreads the suite over N pytest-xdist workers, each taking a
# whole test file at a time (a file's module fixtures, its jobs, made once). On two cores that ends in
# about three quarters of one process's time, but jobs then start several times slower, and tests whose
# timing assumes a quiet machine can fail (docs/reference/testing.md): one process is the default.
workers=${SAGEMAKER_DIST_TEST_WORKERS:-0}
if [ "$workers" -ge 2 ] 2>/dev/null; then
  .venv/bin/python -m pytest -n "$workers" --dist loadfile "$@"
else
  .venv/bin/python -m pytest "$@"
fi
