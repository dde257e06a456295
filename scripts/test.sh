#!/usr/bin/env bash
# Set up (idempotent, cached) and run lint plus the whole test suite. Usage: scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
# Two workers (pytest-xdist), each taking a whole test file at a time (a file's module fixtures, its
# jobs, run once): much of a job is waiting (for ranks, for the toolkit's 30 s after mpirun), so on two
# cores the suite ends in about three quarters of the time one process takes. SAGEMAKER_DIST_TEST_WORKERS
# sets the count; 0 runs every test in this process (as does -n 0 among the arguments).
.venv/bin/python -m pytest -n "${SAGEMAKER_DIST_TEST_WORKERS:-2}" --dist loadfile "$@"
