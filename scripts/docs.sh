#!/usr/bin/env bash
# Build the documentation site into site/ with warnings as errors. Set up first (scripts/setup.sh,
# idempotent and cached, as scripts/test.sh does; then the `docs` extra's pins into .venv when one is
# missing or another version), execute the notebooks (notebooks/horovod_pipe_mode.ipynb,
# notebooks/pytorch_pipe_mode.ipynb) top to bottom in local mode into docs/notebooks/ (ignored build
# copies; the site shows them with their outputs), then `mkdocs build --strict`.
# Usage: scripts/docs.sh [--skip-notebook] (keeps the last executed copies)
set -euo pipefail
cd "$(dirname "$0")/.."

NOTEBOOKS=(horovod_pipe_mode pytorch_pipe_mode)
NOTEBOOK_TIMEOUT_S=${NOTEBOOK_TIMEOUT_S:-900}   # each whole notebook; each cell has its own bound (600 s)
skip_notebook=0
for arg in "$@"; do
  case "$arg" in
    --skip-notebook) skip_notebook=1 ;;
    *) echo "docs.sh: unknown argument $arg (usage: scripts/docs.sh [--skip-notebook])" >&2 && exit 2 ;;
  esac
done

bash scripts/setup.sh

# The docs extra's pins, read from setup.py, installed only when one is missing or differs.
mapfile -t missing < <(.venv/bin/python - <<'EOF'
import ast
from importlib import metadata

tree = ast.parse(open("setup.py", encoding="utf-8").read())
pins = next(
    ast.literal_eval(node.value)
    for node in tree.body
    if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "DOCS" for t in node.targets)
)
for pin in pins:
    name, version = pin.split("==")
    try:
        ok = metadata.version(name) == version
    except metadata.PackageNotFoundError:
        ok = False
    if not ok:
        print(pin)
EOF
)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "docs.sh: installing ${missing[*]}"
  .venv/bin/python -m pip install -q "${missing[@]}"
fi

for name in "${NOTEBOOKS[@]}"; do
  NOTEBOOK=notebooks/$name.ipynb
  EXECUTED=docs/notebooks/$name.ipynb
  started=$SECONDS
  if [ "$skip_notebook" = 0 ] || [ ! -f "$EXECUTED" ]; then
    # In local mode, as the suite runs it (tests/test_notebook.py, tests/test_pytorch_notebook.py: the
    # same script; a copy the suite just made from the unchanged notebook is kept, so CI runs each
    # notebook once); a failing cell fails the build.
    timeout --kill-after=30 "$NOTEBOOK_TIMEOUT_S" \
      .venv/bin/python scripts/lib/execute_notebook.py "$NOTEBOOK" "$EXECUTED" --reuse
    echo "docs.sh: $EXECUTED ready in $((SECONDS - started)) s"
  fi
done

started=$SECONDS
NO_MKDOCS_2_WARNING=1 .venv/bin/python -m mkdocs build --strict --clean --site-dir site
echo "docs.sh: built site/ in $((SECONDS - started)) s"
