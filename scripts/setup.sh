#!/usr/bin/env bash
# Install the system packages the project needs (Debian's, with apt-get, when missing), then create
# .venv with TensorFlow, Horovod (built once, cached by version) and sagemaker-dist, and .venv-toolkit
# (the container environment). Idempotent: a second run only checks what is there. Usage: scripts/setup.sh
# Without root or apt-get, a missing package stops it at once, with the command to run.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TF_PIN="tensorflow-cpu==2.15.1"
HOROVOD_PIN="horovod==0.28.1"
CACHE_ROOT=${SAGEMAKER_DIST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sagemaker-dist}
. scripts/lib/trusted-cache.sh  # trusted_cache_dir: a cache no other user can have written

die() {
  echo "setup.sh: $*" >&2
  exit 1
}

command -v "$PYTHON" >/dev/null || die "no $PYTHON: install Python 3.10+ (Debian: apt-get install python3)"
PYVER=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')

# System packages, by their Debian names:
# - Open MPI with its headers: Horovod is built with MPI as well as Gloo, `--launcher mpirun` and the
#   toolkit's mpirun run real MPI ranks, mpi4py builds;
# - Slurm with munge and PMIx: the slurm tests bring up a private 2-node cluster (scripts/slurm-cluster.sh);
# - a C and C++ toolchain and cmake: Horovod's build, the TFRecord scan, the toolkit's C extension;
# - procps, iproute2, util-linux, mount: the toolkit launcher's namespaces (unshare, mount, ip link);
# - for Debian's own Python, its venv module and headers.
SYSTEM_PACKAGES=(openmpi-bin libopenmpi-dev slurm-wlm munge slurm-client libpmix2 libpmix-dev
  gcc g++ make cmake libc6-dev procps iproute2 util-linux mount)
SYSTEM_COMMANDS=(mpicc mpirun slurmctld slurmd munged sbatch gcc g++ make cmake ps ip unshare mount)
if ! "$PYTHON" -c 'import ensurepip, os, sysconfig; assert os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' 2>/dev/null; then
  case "$(readlink -f "$(command -v "$PYTHON")")" in
    /usr/bin/python3*) SYSTEM_PACKAGES+=("python$PYVER-venv" "python$PYVER-dev") ;;
    *) die "$PYTHON ($(command -v "$PYTHON")) has no venv module or no headers (Python.h): use a full Python 3.10+" ;;
  esac
fi
if command -v dpkg-query >/dev/null; then
  installed=" $({ dpkg-query -W -f='${Package} ${Status}\n' "${SYSTEM_PACKAGES[@]}" 2>/dev/null || true; } \
    | awk '$NF == "installed" { printf "%s ", $1 }')"
  missing=()
  for package in "${SYSTEM_PACKAGES[@]}"; do
    case "$installed" in *" $package "*) ;; *) missing+=("$package") ;; esac
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    install=(apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=600 "${missing[@]}")
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "Installing Debian packages: ${missing[*]}"
      started=$SECONDS
      timeout 900 apt-get update -qq
      DEBIAN_FRONTEND=noninteractive timeout 1800 "${install[@]}" >/dev/null
      echo "   installed in $((SECONDS - started)) s"
    else
      die "missing Debian packages: ${missing[*]}. Run:
  sudo apt-get update && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${missing[*]}
then run scripts/setup.sh again."
    fi
  fi
else
  missing=()
  for tool in "${SYSTEM_COMMANDS[@]}"; do command -v "$tool" >/dev/null || missing+=("$tool"); done
  [ "${#missing[@]}" = 0 ] || die "not on PATH: ${missing[*]}. Install Open MPI with its headers, Slurm with \
munge and PMIx, gcc, g++, make, cmake, procps, iproute2 and util-linux (on Debian: apt-get install \
--no-install-recommends ${SYSTEM_PACKAGES[*]}), then run scripts/setup.sh again."
fi
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

# Whether the venv $1 has a Horovod built with MPI exactly when this machine has Open MPI's headers
# (and, with $2, imports those modules too).
horovod_matches() {
  "$1/bin/python" -c "import sys, horovod.tensorflow as h${2:+, $2}; sys.exit(int(h.mpi_built()) != $WITH_MPI)" 2>/dev/null
}

# A venv is up to date when it was set up by this script from these sources for this Horovod key (its
# stamp) and its Horovod still matches the machine; then the second run installs nothing (seconds).
STAMP=$({ cat scripts/setup.sh setup.py pyproject.toml
  find sagemaker_dist -name '*.[ch]' | LC_ALL=C sort | xargs -r cat; echo "$KEY"; } | sha256sum | cut -c1-16)
up_to_date() {
  [ "$(cat "$1/.sagemaker-dist-setup" 2>/dev/null)" = "$STAMP" ] && horovod_matches "$@"
}

# TensorFlow, then Horovod (built once per key, cached outside the repo) into the venv $1.
install_training_stack() {
  local py="$1/bin/python"
  if [ ! -x "$py" ]; then
    "$PYTHON" -m venv "$1"
  fi
  "$py" -m pip install -q --upgrade "pip>=24" "setuptools>=69,<80" wheel
  # TensorFlow first: Horovod's build links against the installed framework.
  "$py" -m pip install -q "$TF_PIN" "numpy==1.26.4"
  if ! horovod_matches "$1"; then
    trusted_cache_dir "$CACHE_ROOT"  # the wheels are installed: nobody else may have put them there
    if [ -e "$WHEELS" ] || [ -L "$WHEELS" ]; then trusted_cache_dir "$CACHE_ROOT" "$WHEELS"; fi
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
    "$py" -m pip install -q "$WHEELS"/horovod-*.whl  # its own requirements (cloudpickle, psutil, pyyaml)
  fi
}

TOOLKIT_VENV=${TOOLKIT_VENV:-.venv-toolkit}
TOOLKIT_MODULES="sagemaker_tensorflow_container.training, sagemaker_pytorch_container.training, torch, mpi4py, sagemaker_dist.runtime.framing._tfrecord_scan"
# Both venvs checked at once (each check imports TensorFlow, seconds).
up_to_date "$VENV" "sagemaker_dist.runtime.framing._tfrecord_scan, sagemaker_dist.runtime.framing._record_reader, sagemaker_dist.runtime.framing._tar_scan, torch" & venv_check=$!
up_to_date "$TOOLKIT_VENV" "$TOOLKIT_MODULES" & toolkit_check=$!
venv_ok=0 toolkit_ok=0
wait "$venv_check" && venv_ok=1
wait "$toolkit_check" && toolkit_ok=1

if [ "$venv_ok" = 0 ]; then
  install_training_stack "$VENV"
  "$VENV/bin/python" -m pip install -q -e ".[sdk,tensorflow,horovod,local,dev,torch]"  # torch: a CPU build here
  echo "$STAMP" >"$VENV/.sagemaker-dist-setup"
fi

# The "container" environment: what the TF and PyTorch DLCs carry that matters, with no SageMaker SDK.
# AWS's sagemaker-training toolkit 4.8.3 and its TF entry point (sagemaker-tensorflow-training 20.5.0,
# without its pins of numpy < 1.24 and protobuf < 3.20, which TF 2.15 cannot meet), mpi4py, the
# same TF and Horovod; its PyTorch entry point (sagemaker-pytorch-training 2.9.0, the last release
# for sagemaker-training <= 4.8.3) and torch (a CPU build); and our runtime. Tests compare our model of
# the toolkit with it, and `sagemaker-dist local --launcher toolkit` runs each simulated host's toolkit
# entry point in it (the DLC's SAGEMAKER_TRAINING_MODULE picks TF's or PyTorch's).
TOOLKIT_PINS=("sagemaker-training==4.8.3" "mpi4py==4.1.1" "sagemaker-pytorch-training==2.9.0")
# Its Horovod is checked against the machine as .venv's is (a Gloo-only one stays stale after Open MPI
# is installed, and under the toolkit's mpirun every rank would be a world of 1).
if [ "$toolkit_ok" = 0 ]; then
  install_training_stack "$TOOLKIT_VENV"
  "$TOOLKIT_VENV/bin/python" -m pip install -q "${TOOLKIT_PINS[@]}" "numpy==1.26.4"
  "$TOOLKIT_VENV/bin/python" -m pip install -q --no-deps "sagemaker-tensorflow-training==20.5.0"
  "$TOOLKIT_VENV/bin/python" -m pip install -q -e ".[runtime,horovod,torch]"
  echo "$STAMP" >"$TOOLKIT_VENV/.sagemaker-dist-setup"
fi
# The compiled Pipe-mode reader, built against each venv's TensorFlow into the build cache and read
# back (a job's ranks would otherwise build it at first use); where it cannot, the Python reader runs.
# A stamp of its sources (the op's and the framing core it includes) in each venv skips the check (a
# TensorFlow import) when nothing changed.
reader_sources=(sagemaker_dist/runtime/tensorflow/data/native/* sagemaker_dist/runtime/framing/native/*)
reader_stamp=$(cat "${reader_sources[@]}" sagemaker_dist/runtime/tensorflow/data/native_build.py | sha256sum | cut -c1-16)
build_reader() {
  if "$1/bin/python" -m sagemaker_dist.runtime.tensorflow.data.native_build 2>&1 |
    grep -v "^WARNING\|cpu_feature_guard\|oneDNN\|To enable the following"; [ "${PIPESTATUS[0]}" = 0 ]; then
    echo "$reader_stamp" >"$1/.sagemaker-dist-reader"
  fi
}
for venv in "$VENV" "$TOOLKIT_VENV"; do
  if [ "$(cat "$venv/.sagemaker-dist-reader" 2>/dev/null)" != "$reader_stamp" ]; then
    build_reader "$venv" &
  fi
done
wait
echo "sagemaker-dist is installed in $VENV (the container environment, with AWS's toolkit, in $TOOLKIT_VENV)"
