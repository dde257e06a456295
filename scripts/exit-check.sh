#!/usr/bin/env bash
# The suite's heaviest in-process modules in one pytest process, several times over: every run must exit 0.
#
# Usage: scripts/exit-check.sh [--natural] [RUNS]     (RUNS: 5 by default)
#
# The modules load TensorFlow with our compiled op, PyTorch, the compiled readers, Horovod with Open MPI
# (left up to the end) and the tf.data iterators Keras fits keep: the mix whose pytest process once died
# with SIGSEGV (139) after a summary saying every test passed. The suite ends its process with pytest's
# status once every report is written (tests/helpers/process_exit.py); --natural runs the interpreter's
# own exit instead (SAGEMAKER_DIST_TEST_NATURAL_EXIT=1), to see whether the crash there is still to be had.
# A run that does not exit 0 keeps its output, and its core file where the kernel writes one into the
# working directory (core dumps are enabled as far as the limit allows), in the folder printed at the
# end; gdb's backtrace of every thread is printed where gdb is installed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
repo=$(pwd)

natural=0
runs=5
for arg in "$@"; do
    case "$arg" in
        --natural) natural=1 ;;
        -h | --help)
            sed -n '2,12p' "$0"
            exit 0
            ;;
        *[!0-9]* | '')
            echo "exit-check: unknown argument '$arg' (usage: scripts/exit-check.sh [--natural] [RUNS])" >&2
            exit 2
            ;;
        *) runs=$arg ;;
    esac
done

python=$repo/.venv/bin/python
if [[ ! -x $python ]]; then
    echo "exit-check: $python is missing: run scripts/setup.sh first" >&2
    exit 2
fi

modules=(
    tests/runtime/test_pipe_dataset.py
    tests/runtime/test_pipe_readers.py
    tests/runtime/torch/test_record_batches.py
    tests/runtime/torch/test_torch_runtime_parts.py
    tests/runtime/test_horovod_keras.py
    tests/runtime/test_keras_patches.py
)

work=$(mktemp -d "${TMPDIR:-/tmp}/exit-check.XXXXXX")
ulimit -c unlimited 2>/dev/null || ulimit -c "$(ulimit -H -c)" 2>/dev/null || true
pattern=$(cat /proc/sys/kernel/core_pattern 2>/dev/null || echo unknown)
if [[ $natural == 1 ]]; then
    export SAGEMAKER_DIST_TEST_NATURAL_EXIT=1
    how="the interpreter's own exit"
else
    unset SAGEMAKER_DIST_TEST_NATURAL_EXIT
    how="the suite's exit"
fi
echo "exit-check: $runs runs of ${#modules[@]} modules in one process each, $how; core limit $(ulimit -c), core_pattern $pattern"

statuses=()
failed=0
for run in $(seq 1 "$runs"); do
    log=$work/run-$run.log
    stamp=$work/run-$run.start
    touch "$stamp"
    start=$SECONDS
    "$python" -X faulthandler -m pytest -p no:cacheprovider -q -m "not slow" --basetemp "$work/run-$run-tmp" \
        "${modules[@]}" >"$log" 2>&1
    status=$?
    statuses+=("$status")
    rm -rf "$work/run-$run-tmp"
    summary=$(grep -E '^[0-9]+ (passed|failed)|^=+ .*(passed|failed|error)' "$log" | tail -1)
    what=""
    if ((status > 128)); then
        what=" (killed by SIG$(kill -l $((status - 128)) 2>/dev/null || echo $((status - 128))))"
    fi
    echo "run $run: exit $status$what, $((SECONDS - start)) s: ${summary:-no summary}"
    if ((status != 0)); then
        failed=1
        tail -n 40 "$log" | sed 's/^/    /'
        core=$(find "$repo" -maxdepth 1 -type f -name 'core*' -newer "$stamp" 2>/dev/null | head -n 1)
        if [[ -n $core ]]; then
            mv "$core" "$work/run-$run.core"
            echo "    core: $work/run-$run.core"
            if command -v gdb >/dev/null; then
                gdb -batch -iex 'set auto-load python-scripts off' -ex bt -ex 'thread apply all bt' \
                    "$python" "$work/run-$run.core" >"$work/run-$run.gdb" 2>&1
                echo "    gdb: $work/run-$run.gdb; the crashed thread:"
                sed -n '/^#0/,/^$/p' "$work/run-$run.gdb" | head -n 30 | sed 's/^/    /'
            fi
        fi
    fi
    rm -f "$stamp"
done

echo "exit-check: exit statuses ${statuses[*]}"
if ((failed)); then
    echo "exit-check: FAILED; outputs in $work" >&2
    exit 1
fi
rm -rf "$work"
echo "exit-check: every run exited 0"
