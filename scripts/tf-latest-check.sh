#!/usr/bin/env bash
# On the current SageMaker TF DLC's TensorFlow (2.21, Keras 3, Python 3.12), in a virtual environment
# of its own (.venv-tf-latest; the SDK side stays in .venv, made by scripts/setup.sh): PipeModeDataset's
# tests through both readers, then the demo with distribution tf-mwms, its ranks in that environment,
# and a spot interruption of a tf-mwms job on it.
# Idempotent: a second run only checks what is there.
# Usage: scripts/tf-latest-check.sh        (CI runs it after the tests)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${TF_LATEST_VENV:-.venv-tf-latest}
if [ -z "${TF_LATEST_PYTHON:-}" ]; then
  # pyenv's shim exists even where 3.12 is not selected: take a Python that runs
  for candidate in python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python; do
    if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      TF_LATEST_PYTHON=$candidate
      break
    fi
  done
fi
if [ -z "${TF_LATEST_PYTHON:-}" ]; then
  echo "tf-latest-check: no Python 3.12 (the DLC's); set TF_LATEST_PYTHON=/path/to/python3.12" >&2
  exit 2
fi
if [ ! -x .venv/bin/sagemaker-dist ]; then
  echo "tf-latest-check: run scripts/setup.sh first (the SDK side runs in .venv)" >&2
  exit 2
fi
NEEDED="tensorflow, tensorboard, pytest, sagemaker_dist.runtime.framing._tfrecord_scan"
NEEDED="$NEEDED, sagemaker_dist.runtime.framing._record_reader"
if ! "$VENV/bin/python" -c "import $NEEDED" \
  2>/dev/null; then
  "$TF_LATEST_PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade "pip>=24"
  "$VENV/bin/python" -m pip install -q -e ".[tf-latest,test]"
fi
"$VENV/bin/python" -c 'import tensorflow as tf, keras; print("TensorFlow", tf.__version__, "Keras", keras.__version__)'
# The compiled Pipe-mode reader built against this TensorFlow and read back (an error if it cannot be)
"$VENV/bin/python" -m sagemaker_dist.runtime.tensorflow.data.native_build
# PipeModeDataset's tests, each through both readers, on this TensorFlow (CI=true: a skip fails)
started=$(date +%s)
"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/runtime/test_pipe_readers.py tests/runtime/test_pipe_dataset.py
echo "tf-latest-check: the reader tests passed on TF 2.21 in $(( $(date +%s) - started )) s"
started=$(date +%s)
.venv/bin/sagemaker-dist local --demo --distribution tf-mwms --container-python "$VENV/bin/python" --timeout 600
echo "tf-latest-check: the tf-mwms demo ended 0 on TF $("$VENV/bin/python" -c 'import tensorflow as tf; print(tf.__version__)') in $(( $(date +%s) - started )) s"
# A spot interruption of a 2-worker tf-mwms job whose ranks run on this TensorFlow (Keras 3): the
# resumed job trains the stopped epoch's remaining batches once, and one stopped on an epoch's last step
# starts the next (the SDK side and pytest stay in .venv)
started=$(date +%s)
SAGEMAKER_DIST_TEST_RANK_PYTHON="$(cd "$VENV" && pwd)/bin/python" .venv/bin/python -m pytest -q -p no:cacheprovider \
  tests/local/test_local_spot.py -k "tf-mwms or tf_mwms"
echo "tf-latest-check: the tf-mwms stop tests passed on TF 2.21 in $(( $(date +%s) - started )) s"
