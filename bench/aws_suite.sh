#!/usr/bin/env bash
# Optional, not part of CI: run AWS's own PipeModeDataset tests (github.com/aws/sagemaker-tensorflow-extensions,
# tag v1.20.0, test/unit and test/functional) against our PipeModeDataset, once per reader. The tests run
# unchanged but for the import: a temporary copy has `from sagemaker_tensorflow import` replaced by
# `from sagemaker_dist.runtime import`. tests/runtime/test_aws_suite_cases.py carries the same cases for CI,
# which cannot download the suite.
#
# Usage: bench/aws_suite.sh [PYTEST_ARG ...]          e.g. bench/aws_suite.sh -k invalid_data
# Environment:
#   PYTHON             interpreter with TensorFlow (tf.estimator for two functional tests) and pytest;
#                      default: python3. This checkout is put first on PYTHONPATH.
#   AWS_SUITE_READERS  the readers to run (default: "python compiled"; SAGEMAKER_DIST_READER for each)
#   AWS_READER_SRC     a checkout of aws/sagemaker-tensorflow-extensions (holding test/); overrides the mirror
#   AWS_READER_MIRROR  bare git mirror to `git archive` tag v1.20.0 from (default: ../.mirror/ beside this
#                      checkout, as bench/aws_reader_env.sh)
# Prints one "reader <name>: <passed> passed, <failed> failed ..." line per reader; exits 1 if any failed.
set -euo pipefail

AWS_COMMIT=cedd43b37b2a5989f3b76504a96c9255e699cb5c   # tag v1.20.0
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MIRROR=${AWS_READER_MIRROR:-$REPO_ROOT/../.mirror/aws+sagemaker-tensorflow-extensions/repo}
PYTHON=${PYTHON:-python3}
READERS=${AWS_SUITE_READERS:-python compiled}
log() { printf '[aws_suite] %s\n' "$*" >&2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [[ -n "${AWS_READER_SRC:-}" ]]; then
    [[ -d "$AWS_READER_SRC/test/unit" ]] || { log "AWS_READER_SRC=$AWS_READER_SRC has no test/unit"; exit 1; }
    cp -a "$AWS_READER_SRC/test" "$work/test"
    log "suite from $AWS_READER_SRC"
elif git --git-dir="$MIRROR" cat-file -e "$AWS_COMMIT^{commit}" 2>/dev/null; then
    git --git-dir="$MIRROR" archive "$AWS_COMMIT" test | tar -x -C "$work"
    log "suite from $MIRROR at $AWS_COMMIT (v1.20.0)"
else
    log "no copy of AWS's suite: set AWS_READER_SRC=<checkout> or AWS_READER_MIRROR=<git dir holding $AWS_COMMIT>"
    exit 1
fi
# The one change: the import. Integration tests (test/integ) need an AWS account and are left out.
rm -rf "$work/test/integ"
grep -rl "sagemaker_tensorflow" "$work/test" | while read -r file; do
    sed -i 's/from sagemaker_tensorflow import/from sagemaker_dist.runtime import/' "$file"
done
if grep -rn "sagemaker_tensorflow" "$work/test"; then
    log "an import of sagemaker_tensorflow is left in the copy (above): the suite changed; update this script"
    exit 1
fi
printf '[pytest]\n' > "$work/pytest.ini"   # the copy's own rootdir: none of this repository's settings

status=0
for reader in $READERS; do
    run="$work/run-$reader"
    mkdir -p "$run"
    # In a session of its own: the functional tests leave `dd` writers blocked on FIFOs that no
    # epoch reads; they are ended with the session's process group.
    (cd "$work" && SAGEMAKER_DIST_READER=$reader PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}" \
        TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2} \
        exec setsid "$PYTHON" -m pytest -q -p no:cacheprovider -rfE --junitxml="$run/junit.xml" \
        test/unit test/functional "$@") &
    pid=$!
    wait "$pid" || status=1
    kill -- "-$pid" 2>/dev/null || true
    summary=$("$PYTHON" - "$run/junit.xml" <<'EOF'
import sys
import xml.etree.ElementTree as ET

suite = ET.parse(sys.argv[1]).getroot()
suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
total, failures, errors, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
print(f"{total - failures - errors - skipped} passed, {failures} failed, {errors} errors, "
      f"{skipped} skipped of {total}")
EOF
    )
    echo "reader $reader: $summary"
done
exit "$status"
