"""Real ``torchrun`` jobs (2 Gloo ranks on the CPU) over real FIFOs fed like SageMaker's Pipe mode.

Each job runs once per module (module-scoped fixtures) and several tests check what it left: the
per-rank logs of ``ddp_pipe_script.py`` (record ids trained per step), its output and exit code.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers.runtime_helpers import write_opt_ml
from helpers.torchrun_job import TorchrunJob, run_torchrun

from sagemaker_dist.contract.layout import plan_layout
from sagemaker_dist.contract.metric_line import metric_definitions, read_metrics
from sagemaker_dist.contract.record_formats import encode_tfrecord
from sagemaker_dist.local.demo_data import encode_example

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.timeout(180)]

SCRIPT = Path(__file__).with_name("ddp_pipe_script.py")


def example(record_id: int) -> bytes:
    """A ``tf.train.Example`` with an int64 ``id``, 4 floats ``x`` and a float ``y`` (packed lists)."""
    xs = [record_id * 0.01 + i for i in range(4)]
    return encode_example({"id": record_id, "x": xs, "y": [sum(xs) * 0.1]})


def shard(rank: int, count: int) -> bytes:
    """``count`` TFRecord-framed Examples with ids ``rank * 1000 + i``."""
    return b"".join(encode_tfrecord(example(rank * 1000 + i)) for i in range(count))


def run_job(root: Path, out: Path, mode: str, shards: dict[str, list[bytes]], **more) -> TorchrunJob:
    """Feed each channel's epochs through FIFOs and run the script under torchrun with 2 ranks (``more``:
    ``run_torchrun``'s keywords and the job's environment variables)."""
    return run_torchrun(SCRIPT, root, out, shards, TEST_MODE=mode, **more)


def trained(job: TorchrunJob, rank: int) -> dict[int, list[int]]:
    """epoch -> record ids trained by ``rank``, in order."""
    by_epoch: dict[int, list[int]] = {}
    for row in job.events(rank, "step"):
        by_epoch.setdefault(row["epoch"], []).extend(row["ids"])
    return by_epoch


# --- uneven shards: epoch 0 ends at the shortest rank, epoch 1 trains every record through Join ---


@pytest.fixture(scope="module")
def uneven(tmp_path_factory):
    root = write_opt_ml(
        tmp_path_factory.mktemp("uneven") / "opt_ml", ["train_0", "train_1"], plan_layout(1, 2)
    )
    data = {"train_0": [shard(0, 24)] * 2, "train_1": [shard(1, 14)] * 2}  # 6 steps against 4 (the last: 2)
    return run_job(root, root.parent / "out", "train", data), root


def test_uneven_shards_end_together_without_hanging(uneven):
    job, _ = uneven
    assert job.proc.returncode == 0, job.output[-4000:]
    assert job.seconds < 60
    for rank in (0, 1):
        ends = job.events(rank, "epoch_end")
        assert [e["steps"] for e in ends][0] == 4  # the shortest rank's 4 batches (4, 4, 4, 2 records)
        assert ends[0]["ran_out"] == [1]
    assert trained(job, 0)[0] == list(range(16))  # rank 0 stopped with rank 1: 8 records left unread
    assert trained(job, 1)[0] == [1000 + i for i in range(14)]
    # rank 0 names what was not trained: the batch rank 0 had read ahead (the rest of its FIFO unread)
    assert (
        "train epoch ended for every rank after 4 step(s): rank(s) 1 ran out of data. Records read per rank: "
        "[16, 14]; read ahead and not trained on (the rest of the FIFO closed unread): rank 0: 4"
    ) in job.proc.stdout, job.proc.stdout[-3000:]


def test_join_trains_every_record_of_uneven_shards(uneven):
    job, _ = uneven
    assert trained(job, 0)[1] == list(range(24))
    assert trained(job, 1)[1] == [1000 + i for i in range(14)]
    assert all(f.served == 2 and f.error is None for f in job.feeders)  # each FIFO closed, the next opened


def test_metric_lines_and_checkpoints_of_each_epoch(uneven):
    job, root = uneven
    definitions = metric_definitions(["loss"])
    lines = [read_metrics(line, definitions) for line in job.proc.stdout.splitlines() if "metrics:" in line]
    assert [epoch for epoch, _ in lines] == [1, 2]  # rank 0 only, once per epoch
    assert all("loss" in values for _, values in lines)
    names = sorted(p.name for p in (root / "checkpoints").iterdir())
    assert names == ["epoch-00001", "epoch-00002"]


# --- a stop mid-epoch (SIGTERM to one rank), then a resume that loses no step and repeats none ---

STOP_RECORDS = 20  # per rank: 5 steps of 4 per epoch


@pytest.fixture(scope="module")
def stop_and_resume(tmp_path_factory):
    root = write_opt_ml(tmp_path_factory.mktemp("stop") / "opt_ml", ["train_0", "train_1"], plan_layout(1, 2))
    data = {f"train_{r}": [shard(r, STOP_RECORDS)] * 2 for r in (0, 1)}
    stopped = run_job(root, root.parent / "out-stop", "stop", data, TEST_STOP_AFTER="2")
    # the next attempt: a fresh container (FIFOs from _0 again, no epoch counters), the same checkpoints
    for path in (root / "input" / "data").iterdir():
        path.unlink()
    shutil.rmtree(root / "pipe_state", ignore_errors=True)
    data = {f"train_{r}": [shard(r, STOP_RECORDS)] for r in (0, 1)}
    resumed = run_job(root, root.parent / "out-resume", "resume", data)
    return stopped, resumed, root


def test_a_stop_is_agreed_by_every_rank_after_the_same_step(stop_and_resume):
    stopped, _, root = stop_and_resume
    assert stopped.proc.returncode == 0, stopped.output[-4000:]  # an agreed stop ends every rank with 0
    for rank in (0, 1):
        # rank 1 asked during step 2; step 3's agreement was under way (it overlaps the step before)
        (event,) = stopped.events(rank, "stopped")
        assert (event["epoch"], event["step"]) == (1, 3)
        assert trained(stopped, rank)[1] == [rank * 1000 + i for i in range(12)]
    assert "signal SIGTERM" in stopped.proc.stderr
    assert (root / "checkpoints" / "epoch-00001-step-000003" / "state.pt").is_file()


def test_the_resume_loses_no_step_and_repeats_none(stop_and_resume):
    stopped, resumed, _ = stop_and_resume
    assert resumed.proc.returncode == 0, resumed.output[-4000:]
    for rank in (0, 1):
        assert resumed.events(rank, "restored")[0]["resumed_at"] == [1, 3]
        first, second = trained(stopped, rank), trained(resumed, rank)
        assert 0 not in second  # epoch 0 is not trained again
        ids = [rank * 1000 + i for i in range(STOP_RECORDS)]
        assert first[0] == ids
        assert first[1] + second[1] == ids  # each record of the stopped epoch trained once
        steps = [e["step"] for e in stopped.events(rank, "step") if e["epoch"] == 1]
        steps += [e["step"] for e in resumed.events(rank, "step") if e["epoch"] == 1]
        assert steps == [1, 2, 3, 4, 5]


def test_the_resume_restores_model_optimizer_and_scheduler_on_every_rank(stop_and_resume):
    stopped, resumed, _ = stop_and_resume
    at_stop = stopped.events(0, "stopped")[0]
    for rank in (0, 1):
        (restored,) = resumed.events(rank, "restored")
        assert restored["checksum"] == pytest.approx(at_stop["checksum"], abs=1e-9)  # broadcast from rank 0
        assert restored["lr_step"] == at_stop["lr_step"] == 8  # 5 + 3 scheduler steps


# --- a rank that raises: the job fails at once, naming the rank, with its traceback ---


@pytest.fixture(scope="module")
def raising(tmp_path_factory):
    root = write_opt_ml(
        tmp_path_factory.mktemp("raise") / "opt_ml", ["train_0", "train_1"], plan_layout(1, 2)
    )
    data = {f"train_{r}": [shard(r, 40)] for r in (0, 1)}
    return run_job(root, root.parent / "out", "raise", data)


def test_a_rank_that_raises_fails_the_job_naming_the_rank(raising):
    assert raising.proc.returncode != 0
    assert raising.seconds < 60  # the other rank does not wait out its collective timeout alone
    assert "sagemaker-dist: rank 1 (host" in raising.proc.stderr
    assert "ValueError: boom at rank 1's second step" in raising.proc.stderr
    assert "Traceback (most recent call last)" in raising.proc.stderr


# --- a layout planned for another world size: every rank fails before the first collective ---


@pytest.fixture(scope="module")
def mismatched(tmp_path_factory):
    layout = plan_layout(1, 3)  # 3 ranks' channels, torchrun starts 2
    root = write_opt_ml(tmp_path_factory.mktemp("layout") / "opt_ml", layout.channel_names, layout)
    # torchrun stops the other rank once it sees one failed: it looks every 5 s here (0.1 s by default),
    # so a rank that a loaded machine started a second later still reaches its own setup and fails there
    return run_job(root, root.parent / "out", "train", {}, monitor_interval=5)


def test_a_layout_of_another_world_size_fails_fast_before_any_collective(mismatched):
    assert mismatched.proc.returncode != 0
    for rank in (0, 1):
        (failed,) = mismatched.events(rank, "setup_failed")
        assert failed["seconds"] < 0.5
        assert failed["process_group"] is False  # no rendezvous, no collective: nobody waits for a peer
        assert f"rank {rank}" in failed["error"] and "3 train channel(s)" in failed["error"]
        assert "runs 2 ranks" in failed["error"]
    assert "RankChannelError" in mismatched.proc.stderr
