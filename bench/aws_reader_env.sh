#!/usr/bin/env bash
# Build AWS's own PipeModeDataset (`from sagemaker_tensorflow import PipeModeDataset`,
# github.com/aws/sagemaker-tensorflow-extensions, a TensorFlow C++ custom op) into a
# throwaway venv, so the pipe-reader benchmarks can compare against it. The package is
# not on PyPI, so we build it from source here.
#
# Source: tag v1.20.0 = commit cedd43b37b2a5989f3b76504a96c9255e699cb5c (package version
# 2.14.0.1.20.0, "Support TensorFlow v2.14.0"). The upstream branch named "2.14" is
# really the TF 2.13 line (v1.19.x), so we do not use it.
#
# Upstream's setup.py runs CMake with g++-9, requires libcurl, and downloads googletest
# from GitHub for ctest. None of that is needed for the op, so we skip it: g++ compiles
# the op's 5 .cpp files (Dataset, RecordReader, PipeStateManager) with
# tf.sysconfig.get_compile_flags()/get_link_flags() into libPipeModeOp.so, which
# pipemode.py loads from its own package dir. The C++ sources are not patched. Needs
# only g++ with C++17 (Debian g++ 12 works); no apt packages, no CMake, no AWS SDK.
#
# Usage:
#   bench/aws_reader_env.sh            # idempotent: skips whatever is already in place
#   AWS_READER_FORCE=1 bench/aws_reader_env.sh   # rebuild the op even if installed
# Environment:
#   AWS_READER_VENV    venv dir (default ~/.cache/sagemaker-dist/aws-reader-tf2.14.1-py3.10)
#   AWS_READER_PYTHON  base interpreter (default /root/.pyenv/versions/3.10.13/bin/python)
#   AWS_READER_SRC     checkout of aws/sagemaker-tensorflow-extensions (must contain
#                      src/pipemode_op and src/sagemaker_tensorflow); overrides the mirror
#   AWS_READER_MIRROR  bare git mirror to `git archive` from (default below)
# Then run the benchmark from the repository root as: "$AWS_READER_VENV/bin/python" bench/bench_pipe_reader.py --fresh --python "$AWS_READER_VENV/bin/python" --aws
set -euo pipefail

AWS_COMMIT=cedd43b37b2a5989f3b76504a96c9255e699cb5c   # tag v1.20.0
AWS_PKG_VERSION=2.14.0.1.20.0
TF_VERSION=2.14.1
VENV=${AWS_READER_VENV:-$HOME/.cache/sagemaker-dist/aws-reader-tf${TF_VERSION}-py3.10}
BASE_PY=${AWS_READER_PYTHON:-$HOME/.pyenv/versions/3.10.13/bin/python}
# default: a bare mirror of github.com/aws/sagemaker-tensorflow-extensions at ../.mirror/, beside this
# checkout (AWS_READER_MIRROR names another)
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MIRROR=${AWS_READER_MIRROR:-$REPO_ROOT/../.mirror/aws+sagemaker-tensorflow-extensions/repo}
start=$SECONDS
log() { printf '[aws_reader_env] %s\n' "$*" >&2; }

# ---- 1. venv with tensorflow-cpu + our reader's runtime deps ---------------------------
if [[ ! -x "$VENV/bin/python" ]]; then
    [[ -x "$BASE_PY" ]] || { log "base python not found: $BASE_PY (set AWS_READER_PYTHON)"; exit 1; }
    log "creating venv $VENV"
    mkdir -p "$(dirname "$VENV")"
    "$BASE_PY" -m venv "$VENV"
fi
PY="$VENV/bin/python"
if ! "$PY" - <<EOF 2>/dev/null
from importlib.metadata import version
assert version("tensorflow-cpu") == "$TF_VERSION"
assert int(version("numpy").split(".")[0]) < 2
assert version("crc32c").split(".")[0] == "2"
import setuptools, wheel
EOF
then
    log "installing tensorflow-cpu==$TF_VERSION, numpy<2, crc32c into $VENV"
    "$PY" -m pip install -q "tensorflow-cpu==$TF_VERSION" "numpy<2" "crc32c>=2.4,<3" setuptools wheel
fi

# ---- 2. build + install AWS's sagemaker_tensorflow ------------------------------------
STAMP="$VENV/.aws-sagemaker-tensorflow-$AWS_COMMIT"
if [[ -n "${AWS_READER_FORCE:-}" || ! -f "$STAMP" ]] \
   || ! (cd / && "$PY" -c "import sagemaker_tensorflow, os; assert os.path.exists(os.path.join(os.path.dirname(sagemaker_tensorflow.__file__), 'libPipeModeOp.so'))" 2>/dev/null); then
    command -v g++ >/dev/null || { log "g++ not found: apt-get install -y g++"; exit 1; }
    BUILD="$VENV/build/sagemaker-tensorflow-extensions"
    rm -rf "$BUILD"; mkdir -p "$BUILD"
    if [[ -n "${AWS_READER_SRC:-}" ]]; then
        [[ -d "$AWS_READER_SRC/src/pipemode_op" && -d "$AWS_READER_SRC/src/sagemaker_tensorflow" ]] || {
            log "AWS_READER_SRC=$AWS_READER_SRC is not a sagemaker-tensorflow-extensions checkout"; exit 1; }
        log "using source tree AWS_READER_SRC=$AWS_READER_SRC (expected commit $AWS_COMMIT)"
        cp -a "$AWS_READER_SRC/src" "$BUILD/src"
        SRC_DESC="$AWS_READER_SRC"
    elif git --git-dir="$MIRROR" cat-file -e "$AWS_COMMIT^{commit}" 2>/dev/null; then
        log "using git archive $AWS_COMMIT (v1.20.0) from $MIRROR"
        git --git-dir="$MIRROR" archive "$AWS_COMMIT" src | tar -x -C "$BUILD"
        SRC_DESC="$MIRROR@$AWS_COMMIT"
    else
        log "no AWS source: neither AWS_READER_SRC is set nor does $MIRROR hold commit $AWS_COMMIT."
        log "Fix: fetch github:aws/sagemaker-tensorflow-extensions into a git mirror and set"
        log "AWS_READER_MIRROR=<its git dir>, or check out tag v1.20.0 ($AWS_COMMIT) and set AWS_READER_SRC=<dir>."
        exit 1
    fi
    mapfile -t TF_CFLAGS < <("$PY" -c "import tensorflow as tf; print('\n'.join(tf.sysconfig.get_compile_flags()))" 2>/dev/null)
    mapfile -t TF_LFLAGS < <("$PY" -c "import tensorflow as tf; print('\n'.join(tf.sysconfig.get_link_flags()))" 2>/dev/null)
    op="$BUILD/src/pipemode_op"
    pkg="$BUILD/src/sagemaker_tensorflow"
    log "compiling libPipeModeOp.so with g++ ($(g++ -dumpfullversion)) and TF flags: ${TF_CFLAGS[*]}"
    # Same sources/flags as upstream's CMake targets (PipeModeOp + static RecordReader and
    # PipeStateManager); TF's own headers first, upstream's bundled copies (nsync, tstring,
    # crc32c shims) only as a fallback.
    g++ -shared -fPIC -O2 -g -DNDEBUG -DVERSION_INFO="\"$AWS_PKG_VERSION\"" -Wno-pointer-arith \
        "${TF_CFLAGS[@]}" -I"$op/RecordReader" -I"$op/PipeStateManager" -idirafter "$op/include" \
        "$op"/Dataset/src/*.cpp "$op"/RecordReader/*.cpp "$op"/PipeStateManager/*.cpp \
        -o "$pkg/libPipeModeOp.so" "${TF_LFLAGS[@]}" 2> "$BUILD/g++.log" \
        || { cat "$BUILD/g++.log" >&2; exit 1; }
    # Minimal packaging of the two .py files + the .so (upstream setup.py would rerun CMake).
    cat > "$BUILD/setup.py" <<EOF
from setuptools import setup
setup(name="sagemaker_tensorflow", version="$AWS_PKG_VERSION",
      description="AWS sagemaker-tensorflow-extensions $AWS_COMMIT, op built by bench/aws_reader_env.sh",
      packages=["sagemaker_tensorflow"], package_dir={"": "src"},
      package_data={"sagemaker_tensorflow": ["libPipeModeOp.so"]}, zip_safe=False)
EOF
    "$PY" -m pip install -q --no-deps --no-build-isolation --force-reinstall "$BUILD"
    rm -f "$VENV"/.aws-sagemaker-tensorflow-*
    echo "$SRC_DESC" > "$STAMP"
    log "installed sagemaker_tensorflow $AWS_PKG_VERSION from $SRC_DESC"
else
    log "sagemaker_tensorflow from $AWS_COMMIT already installed in $VENV (AWS_READER_FORCE=1 to rebuild)"
fi

# ---- 3. checks -------------------------------------------------------------------------
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-3}   # hide oneDNN/AVX and InputDatasets noise
(cd / && "$PY" -c "import tensorflow as tf; from sagemaker_tensorflow import PipeModeDataset; print(tf.__version__)")

SMOKE=$(mktemp -d)
writer_pid=
cleanup() { [[ -n "$writer_pid" ]] && kill "$writer_pid" 2>/dev/null; rm -rf "$SMOKE"; }
trap cleanup EXIT
mkdir -p "$SMOKE/data" "$SMOKE/config" "$SMOKE/state"
# AWS reads <config_dir>/inputdataconfig.json and only checks that the channel exists and
# has TrainingInputMode == "Pipe" (case-insensitive); RecordWrapperType is ignored.
echo '{"bench": {"TrainingInputMode": "Pipe", "RecordWrapperType": "None"}}' > "$SMOKE/config/inputdataconfig.json"

# Background TFRecord writer (pure python + crc32c, no TF import): writes $2 records to FIFO $1.
write_fifo() {
    "$PY" - "$1" "$2" <<'EOF'
import struct, sys, crc32c
def masked(b):
    c = crc32c.crc32c(b)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF
with open(sys.argv[1], "wb") as f:
    for i in range(int(sys.argv[2])):
        data = b"aws-smoke-%d" % i
        hdr = struct.pack("<Q", len(data))
        f.write(hdr + struct.pack("<I", masked(hdr)) + data + struct.pack("<I", masked(data)))
EOF
}
# Reader in a fresh process, like the benchmark: each new iterator reads
# <pipe_dir>/<channel>_<N>, N taken from <state_dir>/.<channel>-pipe_mode-state, then N+1.
read_epoch() {
    (cd / && timeout 300 "$PY" - "$SMOKE" "$1" <<'EOF'
import os, sys
from sagemaker_tensorflow import PipeModeDataset
root, n = sys.argv[1], int(sys.argv[2])
ds = PipeModeDataset("bench", record_format="TFRecord", state_dir=os.path.join(root, "state"),
                     pipe_dir=os.path.join(root, "data"), config_dir=os.path.join(root, "config"))
recs = [r.numpy() for r in ds]
assert recs == [b"aws-smoke-%d" % i for i in range(n)], recs
print("smoke ok: read %d records from %s" % (len(recs), ", ".join(sorted(os.listdir(os.path.join(root, "data"))))))
EOF
    )
}
for epoch_n in "0 5" "1 3"; do
    set -- $epoch_n
    mkfifo "$SMOKE/data/bench_$1"
    write_fifo "$SMOKE/data/bench_$1" "$2" & writer_pid=$!
    read_epoch "$2"
    wait "$writer_pid"; writer_pid=
done
state=$(cat "$SMOKE/state/.bench-pipe_mode-state")
[[ "$state" == 2 ]] || { log "unexpected pipe state $state (want 2)"; exit 1; }
log "epoch state file .bench-pipe_mode-state = $state after 2 epochs"
log "OK in $((SECONDS - start))s: AWS PipeModeDataset ($AWS_COMMIT) in $VENV"
echo "$VENV"
