#!/usr/bin/env bash
# Optional, not part of CI: run the record/dataset tests and a short pipe-reader benchmark against other
# TensorFlow versions, each in a throwaway virtual environment (downloads tensorflow-cpu each time). The
# dataset tests run both readers: the compiled one is built against that TensorFlow (skipped, naming
# why, where it cannot be).
# Usage: bench/compat_check.sh [TF_VERSION ...]     default: 2.14.1 2.21.0 (TF 2.14 needs Python <= 3.11)
#        PYTHON=/root/.pyenv/versions/3.10.13/bin/python bench/compat_check.sh 2.14.1   (the DLC's Python)
#        BENCH_MB=256 BENCH_REPEATS=5 bench/compat_check.sh ...   (a longer benchmark; default 64 MiB x 3)
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ "$#" -eq 0 ]; then
  set -- 2.14.1 2.21.0
fi

status=0
for version in "$@"; do
  tmp=$(mktemp -d)
  echo "== tensorflow-cpu $version ($("$PYTHON" --version)) in $tmp"
  "$PYTHON" -m venv "$tmp/venv"
  "$tmp/venv/bin/python" -m pip install -q --upgrade pip
  "$tmp/venv/bin/python" -m pip install -q "tensorflow-cpu==$version" "crc32c>=2.4,<3" \
    "pytest>=8,<10" "pytest-timeout>=2.3,<3" "hypothesis>=6.100,<7" "setuptools>=69,<80"
  # The C scan for this Python, in the tree (the tests run both scans and want the compiled one).
  "$tmp/venv/bin/python" setup.py -q build_ext --inplace
  minor=${version%.*}
  keras2=()
  if [ "${minor#2.}" -ge 16 ]; then
    # TF >= 2.16 brings Keras 3, which Horovod does not support: Horovod jobs use tf_keras (Keras 2).
    "$tmp/venv/bin/python" -m pip install -q "tf_keras==$minor.*"
    keras2=(env TF_USE_LEGACY_KERAS=1)
  fi
  # This venv has no Horovod (a 7-minute build): the two tests that start it are left to CI.
  if "${keras2[@]}" env PYTHONPATH="$PWD" "$tmp/venv/bin/python" -m pytest -q -p no:cacheprovider \
      tests/runtime/test_records.py tests/runtime/test_large_records.py tests/runtime/test_pipe_dataset.py \
      tests/runtime/test_pipe_readers.py \
      tests/runtime/test_runtime_config.py tests/runtime/test_ranks.py tests/runtime/test_file_channels.py \
      tests/runtime/test_checkpoints.py tests/runtime/test_horovod_keras.py \
      --deselect tests/runtime/test_horovod_keras.py::test_shard_smaller_than_a_batch_is_named \
      --deselect tests/runtime/test_horovod_keras.py::test_setup_trains_exact_epochs_and_checkpoints; then
    "${keras2[@]}" env PYTHONPATH="$PWD" "$tmp/venv/bin/python" bench/bench_pipe_reader.py \
      --mb "${BENCH_MB:-64}" --repeats "${BENCH_REPEATS:-3}" || status=1
  else
    status=1
  fi
  rm -rf "$tmp"
done
exit "$status"
