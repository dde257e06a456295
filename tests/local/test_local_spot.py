"""Spot interruptions in local mode: ``--interrupt-at`` on real ranks (horovodrun, mpirun, AWS's
toolkit; tf-mwms workers with TF_CONFIG), real FIFOs fed from S3 (moto server), TensorFlow. The job's
records carry ids; each rank logs the ids of every batch its train step trained, so the test counts
batches across the attempts: no epoch restarted, no batch skipped, at most the step in flight repeated.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.stop_jobs import after_batches, check_resumed_inside_the_epoch, shard_bytes, trained_segments

from sagemaker_dist.contract.stop_lines import resumed_line, stopped_line
from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.local.backend import LocalBackend
from sagemaker_dist.local.demo import demo_estimator
from sagemaker_dist.local.demo_data import write_demo_data
from sagemaker_dist.local.job import run_local
from sagemaker_dist.local.launchers.mpi import horovod_mpi_built
from sagemaker_dist.local.spot import Attempt, check_interrupts, run_interrupted, stop_positions

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "tests" / "helpers" / "local_scripts"
TOOLKIT_PYTHON = REPO / ".venv-toolkit" / "bin" / "python"
FILES, PER_FILE, BATCH, EPOCHS = 4, 80, 4, 3  # 2 files a rank: 160 records, 40 steps an epoch
# The interruption comes once rank 0 has trained half of its second epoch (after_batches), whatever the
# start-up took (TensorFlow: about 6 s on a quiet machine, 15 s under load; the toolkit downloads the code
# and starts mpirun first, and its MPI master sleeps 30 s after mpirun ends), INTERRUPT_BY_S at the
# latest. A step sleeps PAUSE_S: the stop, agreed a step or two after SIGTERM, lands inside the epoch.
# "one-rank": horovodrun with a world of one (4 files: 80 steps an epoch); "counted": horovodrun with
# train_records= (epochs of a known step count, the stop agreed in an allreduce after each step)
INTERRUPT_BY_S = 180.0
PAUSE_S = 0.1
SIGTERM_TO_END_S = {"toolkit": 60.0}  # the others: 30 s
JOB_TIMEOUT_S = 240
CLI = [sys.executable, "-m", "sagemaker_dist.cli"]


def _data(s3, bucket) -> dict[str, list[int]]:
    """FILES train files on S3 with ids; returns each file's ids by key."""
    ids = {}
    for i in range(FILES):
        key = f"ids/train/part-{i:05d}.tfrecord"
        s3.put_object(Bucket=bucket, Key=key, Body=shard_bytes(i * PER_FILE, PER_FILE, seed=i))
        ids[key] = list(range(i * PER_FILE, (i + 1) * PER_FILE))
    return ids


def _mwms_rank_python() -> dict:
    """tf-latest-check.sh runs the tf-mwms tests with their ranks on TF 2.21 (Keras 3)."""
    python = os.environ.get("SAGEMAKER_DIST_TEST_RANK_PYTHON")
    return {"container_python": Path(python)} if python else {}


def _request(
    bucket, out: Path, hosts=2, per_host=1, epochs=EPOCHS, distribution="horovod", pause=0.12, **more
):
    mwms, torch = distribution == "tf-mwms", distribution == "torchrun"
    estimator = demo_estimator(
        bucket, hosts, per_host, "Pipe",
        {"epochs": epochs, "batch_size": BATCH, "pause": pause, "out": str(out),
         "helper": "mwms" if mwms else "horovod", **more},
        distribution=distribution,
        source_dir=SCRIPTS, entry_point="train_ids_torch.py" if torch else "train_ids.py",
        checkpoint_s3_uri=f"s3://{bucket}/ckpt/spot",
    )  # fmt: skip
    # prepared for local mode (as the CLI does): SageMaker's GPU-only rule for torchrun is not checked
    return estimator.prepare(
        {"train": f"s3://{bucket}/ids/train/"}, printer=None, backend=LocalBackend()
    ).request


@pytest.mark.parametrize(
    "launcher",
    ["horovodrun", "mpirun", "toolkit", "tf-mwms", "one-rank", "counted", "torchrun", "torchrun-toolkit"],
)
def test_interrupted_job_restarts_and_trains_each_remaining_batch_once(s3, bucket, tmp_path, launcher):
    """torchrun: our launcher, 2 hosts x 1; torchrun-toolkit: AWS's toolkit running torchrun, 2 x 2."""
    if launcher in ("mpirun", "toolkit"):
        assert horovod_mpi_built(), (
            "Horovod was built without MPI: scripts/setup.sh rebuilds it with Open MPI"
        )
    toolkit = launcher in ("toolkit", "torchrun-toolkit")
    if toolkit and (os.geteuid() != 0 or not TOOLKIT_PYTHON.exists()):
        pytest.skip("--launcher toolkit needs root and .venv-toolkit (scripts/setup.sh)")
    # the toolkit runs one host of a Horovod job (its mpirun), one per host of a torchrun job
    shape = {"toolkit": (1, 2), "one-rank": (1, 1), "torchrun-toolkit": (2, 2)}.get(launcher, (2, 1))
    where = {"container_python": TOOLKIT_PYTHON} if toolkit else {}
    if launcher == "tf-mwms":
        where = _mwms_rank_python()
    distribution = {"tf-mwms": "tf-mwms", "torchrun": "torchrun", "torchrun-toolkit": "torchrun"}
    _data(s3, bucket)
    out = tmp_path / "out"
    out.mkdir()
    lines: list[str] = []
    epochs = EPOCHS
    world = shape[0] * shape[1]
    steps = FILES * PER_FILE // BATCH // world
    counted = {"train_records": FILES * PER_FILE // 2} if launcher == "counted" else {}
    attempts, result = run_interrupted(
        _request(bucket, out, *shape, epochs, distribution.get(launcher, "horovod"), PAUSE_S, **counted),
        SCRIPTS, [INTERRUPT_BY_S], run=run_local, echo=lines.append, when=after_batches(out, steps * 3 // 2),
        launcher="toolkit" if toolkit else launcher if launcher in ("mpirun", "torchrun") else "horovodrun",
        work_dir=tmp_path / "work",
        timeout=JOB_TIMEOUT_S, **where,
    )  # fmt: skip
    log = "\n".join(lines)
    (tmp_path / "job.log").write_text(log)  # the whole of it, for a failure's reader
    assert [a.status for a in attempts] == ["Stopped", "Completed"], log[-4000:]
    first, second = attempts
    assert first.stopped_at is not None, log[-4000:]
    assert first.ended_after_signal < SIGTERM_TO_END_S.get(launcher, 30.0), log[-4000:]
    epoch, step = first.stopped_at  # epoch counted from 1, as Keras prints it
    # the stop's own checkpoint: nothing lost (one on an epoch's last step is of the whole epoch);
    # resumed where it stopped, the epoch counted from 1 in both lines
    assert second.resumed_from == ((epoch + 1, 0) if step == steps else (epoch, step)), log[-3000:]
    for rank in range(world):
        one, two = trained_segments(out / f"trained-rank{rank}.jsonl")
        check_resumed_inside_the_epoch(
            one, two, (epoch, step), steps, epochs,
            split_tail=launcher == "tf-mwms",
        )  # fmt: skip


def test_tf_mwms_stopped_on_an_epochs_last_step_resumes_at_the_next_epoch(s3, bucket, tmp_path):
    """The workers agree on a stop after the first epoch's last step (rank 0 asks for it there): the
    strategy's iterator says the epoch is over, so the checkpoint is of the whole epoch and the resumed
    job starts the next one (skipping a whole epoch would leave Keras an epoch of no step)."""
    _data(s3, bucket)
    out = tmp_path / "out"
    out.mkdir()
    steps = 2 * PER_FILE // BATCH
    request = _request(bucket, out, 2, 1, 2, "tf-mwms", 0.05, stop_after_steps=steps)
    logs = []
    for attempt in (1, 2):  # the second restores the checkpoints from the request's S3 URI
        lines: list[str] = []
        work = tmp_path / f"work{attempt}"
        run_local(
            request, SCRIPTS, echo=lines.append, work_dir=work, timeout=JOB_TIMEOUT_S, **_mwms_rank_python()
        )
        logs.append("\n".join(lines))
    assert f"stopped in epoch 1 after step {steps} (its last) on every rank" in logs[0], logs[0][-4000:]
    assert stop_positions(logs[1].splitlines())[1] == (2, 0), logs[1][-4000:]  # at the start of epoch 2
    for rank in range(2):
        one, two = trained_segments(out / f"trained-rank{rank}.jsonl")
        assert len(one["epochs"][0]) == steps and sorted(two["epochs"]) == [1]
        assert len(two["epochs"][1]) == steps


def test_the_stop_and_resume_lines_name_one_place_the_same_way():
    """One stop is named the same way where it stopped and where it resumed: every line counts epochs
    from 1 (as the metric line's epoch=), with the steps of that epoch trained."""
    stop = stopped_line(3, 11) + "; checkpoint epoch-00002-step-000011"
    resume = resumed_line("epoch-00002-step-000011", 2, 11)  # the checkpoint: 2 epochs done, 11 steps
    assert "sagemaker-dist: stopped in epoch 3 after step 11 on every rank" in stop
    assert (
        "sagemaker-dist: resuming from checkpoint epoch-00002-step-000011 in epoch 3 after step 11" in resume
    )
    stopped, resumed = stop_positions([stop])[0], stop_positions([resume])[1]
    assert stopped == resumed == (3, 11)
    first = Attempt(1, 30.0, "Stopped", 2.0, stopped_at=stopped)
    second = Attempt(2, None, "Completed", resumed_from=resumed)
    assert first.line().endswith("; the ranks stopped in epoch 3 after step 11")
    assert second.line().endswith("; resumed in epoch 3 after step 11")
    # stopped after its epoch's last step: the checkpoint is of the whole epoch, the next one starts
    whole = resumed_line("epoch-00003-step-000000", 3, 0)
    assert "resuming from checkpoint epoch-00003-step-000000 at the start of epoch 4" in whole
    assert stop_positions([whole])[1] == (4, 0)
    assert (
        Attempt(2, None, "Completed", resumed_from=(4, 0))
        .line()
        .endswith("; resumed at the start of epoch 4")
    )
    assert "resumed" not in Attempt(1, None, "Completed", resumed_from=(1, 0)).line()  # a fresh start


def test_an_interrupted_attempt_names_the_ranks_that_ended_on_the_sigterm_itself():
    def interrupted(on_signal):
        return Attempt(1, 5.0, "Interrupted", 0.2, ranks_up=(4, 4), on_signal=on_signal).line()

    assert "; every rank ended on SIGTERM itself, none in a stop" in interrupted([0, 1, 2, 3])
    partly = interrupted([0])  # the others' scripts had ended with 0 (rank 0 still saving its model)
    assert "; rank(s) 0 ended on SIGTERM itself, the others had ended (exit 0), none in a stop" in partly
    assert "every rank" not in partly


def test_interrupt_at_needs_a_checkpoint_uri_and_positive_seconds():
    with pytest.raises(ConfigurationError, match="no CheckpointConfig.S3Uri"):
        check_interrupts([30.0], None)
    with pytest.raises(ConfigurationError, match="--interrupt-at -1"):
        check_interrupts([-1], "s3://b/c")
    check_interrupts([30.0, 40.0], "s3://b/c")


def test_demo_interrupted_in_start_up_then_as_the_docs_say_ends_0_with_3_attempts(tmp_path):
    """The docs' command, ``sagemaker-dist local --demo -p epochs=6 --interrupt-at 15``, after an attempt
    interrupted 0.2 s after its launcher started (no rank up: the launcher gets SIGTERM, as a container's
    entry point does). 15 s is inside the training on a quiet machine (Stopped, a stop checkpoint); under
    load TensorFlow's start-up takes longer, and a rank still starting ends on SIGTERM (Interrupted)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    proc = subprocess.run(
        [*CLI, "local", "--demo", "-p", "epochs=6", "--interrupt-at", "0.2", "--interrupt-at", "15",
         "--s3-state-dir", str(tmp_path / "s3"), "--work-dir", str(tmp_path / "work")],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-5000:]
    summary = output[output.index("[spot] 3 attempt(s):") :]
    assert "SIGTERM to the launcher and its processes" in output, output[-5000:]
    assert not _processes_in(tmp_path / "work"), "processes of the job outlived it"

    assert "attempt 1: Interrupted" in summary and "start-up (0 of 2 up)" in summary, summary
    stopped = "attempt 2: Stopped" in summary and "the ranks stopped in epoch" in summary
    assert stopped or "attempt 2: Interrupted" in summary, summary
    assert "attempt 3: Completed" in summary, summary


def _plain_request(s3, bucket, **hps):
    """2 hosts x 1 rank of ``print_rank_env.py`` (no framework, no stop handler of the runtime)."""
    write_demo_data(f"s3://{bucket}/data/", files=2, records_per_file=2, validation_files=2, client=s3)
    estimator = demo_estimator(
        bucket, 2, 1, "Pipe", {"epochs": 1, **hps}, source_dir=SCRIPTS, entry_point="print_rank_env.py",
        checkpoint_s3_uri=f"s3://{bucket}/ckpt/plain",
    )  # fmt: skip
    return estimator.prepare({"train": f"s3://{bucket}/data/train/"}, printer=None).request


def _interrupt_once_both_ranks_said(s3, bucket, tmp_path, text: str, **hps):
    """``print_rank_env.py`` with ``hps``, its first attempt interrupted once both ranks printed ``text``:
    ``(attempts, the command's lines)``."""
    lines: list[str] = []
    attempts, _ = run_interrupted(
        _plain_request(s3, bucket, **hps), SCRIPTS, [60.0], run=run_local, echo=lines.append,
        when=lambda attempt: attempt == 1 and sum(text in line for line in lines) >= 2,
        work_dir=tmp_path, timeout=120,
    )  # fmt: skip
    return attempts, "\n".join(lines)


def test_an_interruption_after_every_rank_has_ended_its_script_is_no_restart(s3, bucket, tmp_path):
    """SIGTERM while the ranks' scripts have ended (exit 0) but their processes still tear down: the
    attempt completed; the rank ends with its script's code, and nothing starts again."""
    attempts, log = _interrupt_once_both_ranks_said(s3, bucket, tmp_path, "exits with code 0", linger=6)
    assert "[spot] interruption: SIGTERM to rank process(es)" in log, log[-3000:]
    assert [a.status for a in attempts] == ["Completed"], log[-3000:]
    assert "every rank's script had ended (exit 0) before it: nothing to start again" in log, log[-3000:]


def test_ranks_that_end_on_the_sigterm_itself_read_interrupted_and_start_again(s3, bucket, tmp_path):
    """Every rank up, none with the runtime's stop (still starting, or a script without one): each ends
    on the SIGTERM itself. That is an interruption, not a failure; the next attempt runs the job."""
    attempts, log = _interrupt_once_both_ranks_said(s3, bucket, tmp_path, "works 8.0 s", busy=8)
    assert [a.status for a in attempts] == ["Interrupted", "Completed"], log[-3000:]
    assert "every rank ended on SIGTERM itself, none in a stop the ranks agreed" in attempts[0].line(), log


def test_the_local_command_runs_a_script_under_shufflecfg_and_restarts_it_after_an_interruption(
    s3, bucket, tmp_path, aws_env
):
    """``--shuffle-seed`` with ``--interrupt-at`` on the command line: the request carries ShuffleConfig
    on each Pipe channel, the ranks are interrupted and the job starts again."""
    write_demo_data(f"s3://{bucket}/data/", files=2, records_per_file=2, validation_files=2, client=s3)
    proc = subprocess.run(
        [*CLI, "local", "--entry-point", "print_rank_env.py", "--source-dir", str(SCRIPTS),
         "--train", f"s3://{bucket}/data/train/", "--output-path", f"s3://{bucket}/jobs",
         "--checkpoint-s3-uri", f"s3://{bucket}/ckpt/cli", "--endpoint-url", aws_env["AWS_ENDPOINT_URL"],
         "--shuffle-seed", "5", "--interrupt-at", "3", "-p", "busy=8", "--work-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert "ShuffleConfig seed 5" in output, output[-3000:]
    assert "[spot] interruption: SIGTERM" in output and "[spot] 2 attempt(s):" in output, output[-3000:]
    assert proc.returncode == 0, output[-3000:]


def _processes_in(folder: Path) -> list[int]:
    """Live processes whose working directory is in ``folder`` (a job's ranks run in its trees)."""
    found = []
    for cwd in Path("/proc").glob("[0-9]*/cwd"):
        try:
            if Path(os.readlink(cwd)).is_relative_to(folder):
                found.append(int(cwd.parent.name))
        except OSError:
            pass
    return found
