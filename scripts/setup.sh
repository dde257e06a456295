#!/usr/bin/env bash
# Create .venv with TensorFlow, Horovod (built once, cached by version) and sagemaker-dist.
# Idempotent: a second run only checks what is there. Usage: scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TF_PIN="tensorflow-cpu==2.15.1"
HOROVOD_PIN="horovod==0.28.1"
CACHE_ROOT=${SAGEMAKER_DIST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sagemaker-dist}
PYVER=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
# With Open MPI's headers (Debian: libopenmpi-dev) Horovod is built with MPI as well as Gloo, so
# `--launcher mpirun` runs real MPI ranks; the cache key says which build it holds.
if command -v mpicc >/dev/null 2>&1; then
  MPI="mpi-$(mpicc --showme:version 2>/dev/null | head -n1 | tr -cd '[:alnum:].')"
  WITH_MPI=1
else
  MPI="no-mpi"
  WITH_MPI=0
fi
KEY=$(printf '%s|%s|%s|%s|%s' "$TF_PIN" "$HOROVOD_PIN" "$PYVER" "$(uname -m)" "$MPI" | sha256sum | cut -c1-16)
WHEELS="$CACHE_ROOT/horovod-$KEY"

# TensorFlow, then Horovod (built once per key, cached outside the repo) into the venv $1.
install_training_stack() {
  local py="$1/bin/python"
  if [ ! -x "$py" ]; then
    "$PYTHON" -m venv "$1"
  fi
  "$py" -m pip install -q --upgrade "pip>=24" "setuptools>=69,<80" wheel
  # TensorFlow first: Horovod's build links against the installed framework.
  "$py" -m pip install -q "$TF_PIN" "numpy==1.26.4"
  if ! "$py" -c "import horovod.tensorflow as h, sys; sys.exit(int(h.mpi_built()) != $WITH_MPI)" 2>/dev/null; then
    if ! ls "$WHEELS"/horovod-*.whl >/dev/null 2>&1; then
      echo "Building $HOROVOD_PIN ($MPI; about 7 minutes on 2 cores; cached in $WHEELS)"
      tmp=$(mktemp -d)
      if [ "$WITH_MPI" = 1 ]; then export HOROVOD_WITH_MPI=1; else export HOROVOD_WITHOUT_MPI=1; fi
      HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_PYTORCH=1 \
        HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)" \
        "$py" -m pip wheel -q --no-cache-dir --no-build-isolation --no-deps -w "$tmp" "$HOROVOD_PIN"
      mkdir -p "$CACHE_ROOT"
      rm -rf "$WHEELS.partial" && mv "$tmp" "$WHEELS.partial" && mv "$WHEELS.partial" "$WHEELS"
    fi
    "$py" -m pip install -q --force-reinstall --no-deps "$WHEELS"/horovod-*.whl
  fi
}

install_training_stack "$VENV"
"$VENV/bin/python" -m pip install -q -e ".[sdk,tensorflow,horovod,local,dev]"

# The "container" environment: what the TF DLC carries that matters, with no SageMaker SDK. AWS's
# sagemaker-training toolkit 4.8.3 and its TF entry point (sagemaker-tensorflow-training 20.5.0,
# without its pins of numpy < 1.24 and protobuf < 3.20, which TF 2.15 cannot meet), mpi4py, the
# same TF and Horovod, and our runtime. Tests compare our model of the toolkit with it, and
# `sagemaker-dist local --launcher toolkit` runs each simulated host's toolkit entry point in it.
TOOLKIT_VENV=${TOOLKIT_VENV:-.venv-toolkit}
TOOLKIT_PINS=("sagemaker-training==4.8.3" "mpi4py==4.1.1")
if ! "$TOOLKIT_VENV/bin/python" -c 'import sagemaker_tensorflow_container.training, mpi4py, sagemaker_dist.runtime.framing._tfrecord_scan, horovod.tensorflow' 2>/dev/null; then
  install_training_stack "$TOOLKIT_VENV"
  "$TOOLKIT_VENV/bin/python" -m pip install -q "${TOOLKIT_PINS[@]}" "numpy==1.26.4"
  "$TOOLKIT_VENV/bin/python" -m pip install -q --no-deps "sagemaker-tensorflow-training==20.5.0"
  "$TOOLKIT_VENV/bin/python" -m pip install -q -e ".[runtime,horovod]"
fi
echo "sagemaker-dist is installed in $VENV (the container environment, with AWS's toolkit, in $TOOLKIT_VENV)"
