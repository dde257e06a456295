"""Real ``torchrun`` jobs of an FSDP2 model (Gloo on the CPU) over real FIFOs: sharded DCP checkpoints.

``fsdp_pipe_script.py`` trains a small MLP under ``fully_shard`` on raw 28-byte records read by
``RecordBatches``; rank 0 dumps the whole state (gathered from the shards) where the tests compare it
with what the checkpoints hold (read back with ``read_sharded_checkpoint``, the way every rank reads
them). Jobs run once per module and several tests check what they left.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers.runtime_helpers import write_opt_ml
from helpers.torchrun_job import run_torchrun

from sagemaker_dist.contract.layout import plan_layout
from sagemaker_dist.contract.record_formats import encode_tfrecord
from sagemaker_dist.runtime.checkpoint_format import list_checkpoints

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.timeout(400)]

SCRIPT = Path(__file__).with_name("fsdp_pipe_script.py")
RECORDS = 20  # per rank and epoch: 5 steps of 4
RECORD = np.dtype([("id", "<i8"), ("x", "<f4", 4), ("y", "<f4")])


def shard(rank: int, count: int = RECORDS) -> bytes:
    """``count`` TFRecord-framed raw records with ids ``rank * 1000 + i``."""
    rows = np.zeros(count, RECORD)
    rows["id"] = rank * 1000 + np.arange(count)
    rows["x"] = (rows["id"][:, None] % 97) * 0.01 + np.arange(4)
    rows["y"] = rows["x"].sum(axis=1) * 0.1
    return b"".join(encode_tfrecord(row.tobytes()) for row in rows)


def job_root(base: Path, world: int) -> Path:
    layout = plan_layout(1, world)
    return write_opt_ml(base / "opt_ml", layout.channel_names, layout)


def feed(world: int, epochs: int) -> dict[str, list[bytes]]:
    return {f"train_{r}": [shard(r)] * epochs for r in range(world)}


def fresh_container(root: Path) -> None:
    """The next attempt: new FIFOs from ``_0``, no epoch counters; the same checkpoints."""
    for path in (root / "input" / "data").iterdir():
        path.unlink()
    shutil.rmtree(root / "pipe_state", ignore_errors=True)


def state(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def checkpoint_state(root: Path, name: str) -> dict:
    from sagemaker_dist.runtime.torch.sharded import read_sharded_checkpoint

    return read_sharded_checkpoint(root / "checkpoints" / name)


def assert_same_state(saved: dict, restored: dict) -> None:
    """Model and optimizer equal to the last bit: every tensor, every moment, every hyperparameter."""
    assert sorted(saved["model"]) == sorted(restored["model"])
    for name, tensor in saved["model"].items():
        assert torch.equal(tensor, restored["model"][name]), name
    assert sorted(saved["optim"]["state"]) == sorted(restored["optim"]["state"])
    for param, moments in saved["optim"]["state"].items():
        for key, value in moments.items():
            assert torch.equal(
                torch.as_tensor(value), torch.as_tensor(restored["optim"]["state"][param][key])
            )
    groups = [{k: v for k, v in g.items() if k != "params"} for g in saved["optim"]["param_groups"]]
    again = [{k: v for k, v in g.items() if k != "params"} for g in restored["optim"]["param_groups"]]
    assert json.dumps(groups, sort_keys=True, default=list) == json.dumps(again, sort_keys=True, default=list)


def trained(job, rank: int) -> dict[int, list[tuple[int, list[int], float]]]:
    """epoch -> [(step, ids, loss)] trained by ``rank``."""
    out: dict[int, list] = {}
    for row in job.events(rank, "step"):
        out.setdefault(row["epoch"], []).append((row["step"], row["ids"], row["loss"]))
    return out


# --- a stop mid-epoch with async step checkpoints, the resume, and the same job never stopped ---


def stop_then_resume(base: Path, **stop_env):
    """A 2-rank job stopped by rank 1 (``stop_env``), what it left in its checkpoint directory, and the
    next attempt on a fresh container; 2 epochs, a step checkpoint every 2 steps."""
    root = job_root(base, 2)
    stopped = run_torchrun(SCRIPT, root, base / "out-stop", feed(2, 2), **COMMON, **stop_env)
    stopped.left = [c.path.name for c in list_checkpoints(root / "checkpoints")]
    stopped.leftovers = {
        p.name: sorted(f.name for f in p.iterdir()) for p in (root / "checkpoints").glob(".tmp-*")
    }
    fresh_container(root)
    resumed = run_torchrun(SCRIPT, root, base / "out-resume", feed(2, 1), **COMMON)
    return stopped, resumed, root


COMMON = {"TEST_EPOCHS": "2", "TEST_EVERY": "2"}


@pytest.fixture(scope="module")
def stopped_job(tmp_path_factory):
    base = tmp_path_factory.mktemp("fsdp-stop")
    stopped, resumed, root = stop_then_resume(base, TEST_STOP_AT="1:2", TEST_DUMP_EVERY="1")
    other = job_root(base / "never-stopped", 2)
    never = run_torchrun(SCRIPT, other, base / "out-never", feed(2, 2), **COMMON)
    return stopped, resumed, never, root


def test_a_stop_writes_every_ranks_shard_and_commits_it(stopped_job):
    stopped, _, _, root = stopped_job
    assert stopped.proc.returncode == 0, stopped.output[-4000:]
    for rank in (0, 1):
        (event,) = stopped.events(rank, "stopped")
        # rank 1 asked during step 2; step 3's agreement was under way: every rank stops after step 3
        assert (event["epoch"], event["step"]) == (1, 3)
        assert event["checkpoint"] == "epoch-00001-step-000003"
    meta = json.loads((root / "checkpoints" / "epoch-00001-step-000003" / "meta.json").read_text())
    assert meta["format"] == "torch-dcp" and meta["world_size"] == 2
    assert sorted(meta["files"]) == ["__0_0.distcp", "__1_0.distcp", "dcp.metadata"]
    assert meta["scheduler"]["last_epoch"] == 8  # 5 + 3 steps, as plain JSON
    assert meta["extra"]["state"]["batches_seen"] == 8
    assert "; checkpoint epoch-00001-step-000003" in stopped.proc.stdout
    assert stopped.left == [
        "epoch-00000-step-000002",
        "epoch-00000-step-000004",
        "epoch-00001",
        "epoch-00001-step-000002",
        "epoch-00001-step-000003",
    ]
    assert stopped.leftovers == {}


def test_async_step_checkpoints_hold_the_state_of_their_step_while_training_goes_on(stopped_job):
    stopped, _, _, root = stopped_job
    dumps = sorted(stopped.out.glob("state-step-*.pt"))
    assert [p.name for p in dumps] == ["state-step-0-2.pt", "state-step-0-4.pt", "state-step-1-2.pt"]
    for dump in dumps:
        epoch, step = (int(v) for v in dump.stem.split("-")[2:])
        # the save was started after this step; the next steps trained while its shards were written
        assert_same_state(state(dump), checkpoint_state(root, f"epoch-{epoch:05d}-step-{step:06d}"))
    blocked = stopped.events(0, "stopped")[0]["blocked_s"]
    assert len(blocked) == 5  # four in the background, the stop's in the loop


def test_the_resume_restores_model_optimizer_scheduler_and_state(stopped_job):
    _, resumed, _, root = stopped_job
    assert resumed.proc.returncode == 0, resumed.output[-4000:]
    for rank in (0, 1):
        (restored,) = resumed.events(rank, "restored")
        assert restored["resumed_at"] == [1, 3]
        assert restored["lr_step"] == 8
        assert restored["state"] == {"batches_seen": 8}
    assert_same_state(
        checkpoint_state(root, "epoch-00001-step-000003"), state(resumed.out / "state-restored.pt")
    )
    assert "resuming" in resumed.proc.stdout and "epoch-00001-step-000003" in resumed.proc.stdout


def test_the_resume_goes_on_from_the_same_loss_as_a_job_never_stopped(stopped_job):
    stopped, resumed, never, _ = stopped_job
    assert never.proc.returncode == 0, never.output[-4000:]
    for rank in (0, 1):
        first, second, whole = trained(stopped, rank), trained(resumed, rank), trained(never, rank)
        assert 0 not in second  # epoch 0 is not trained again
        assert [s for s, _, _ in first[1] + second[1]] == [1, 2, 3, 4, 5]  # no step lost or repeated
        assert [i for _, i, _ in first[1] + second[1]] == [i for _, i, _ in whole[1]]
        losses = [loss for _, _, loss in first[0] + first[1] + second[1]]
        assert losses == pytest.approx([loss for _, _, loss in whole[0] + whole[1]], rel=1e-6, abs=1e-9)
    assert_same_state(state(never.out / "state-final.pt"), state(resumed.out / "state-final.pt"))


# --- a rank that cannot write its stop shard in time: the previous complete checkpoint stays in force ---


@pytest.fixture(scope="module")
def slow_stop(tmp_path_factory):
    return stop_then_resume(
        tmp_path_factory.mktemp("fsdp-slow"),
        TEST_STOP_AT="1:2",
        TEST_SLOW_CHECKPOINT="epoch-00001-step-000003",
        SAGEMAKER_DIST_STOP_GRACE="6",
    )


def test_a_stop_shard_that_cannot_be_written_in_time_never_counts(slow_stop):
    stopped, _, root = slow_stop
    assert stopped.proc.returncode != 0
    assert stopped.seconds < 90  # the watchdog ended the stalled rank; nobody waited out its 120 s
    assert "did not stop within 6 s" in stopped.proc.stderr
    assert stopped.left[-1] == "epoch-00001-step-000002"  # the stop's own never became one
    ((half, files),) = stopped.leftovers.items()
    assert half.startswith(".tmp-epoch-00001-step-000003-")
    assert "__0_0.distcp" in files and "meta.json" not in files  # rank 0 wrote its shard, nobody committed


def test_the_next_attempt_resumes_from_the_previous_complete_checkpoint(slow_stop):
    stopped, resumed, root = slow_stop
    assert resumed.proc.returncode == 0, resumed.output[-4000:]
    for rank in (0, 1):
        (restored,) = resumed.events(rank, "restored")
        assert restored["resumed_at"] == [1, 2]
    assert not list((root / "checkpoints").glob(".tmp-*"))  # the half-written one was cleared at start


# --- resharding: saved by 4 ranks, resumed on 2; saved by 2, resumed on 4 ---


@pytest.fixture(scope="module")
def resharded(tmp_path_factory):
    base = tmp_path_factory.mktemp("fsdp-reshard")
    four = job_root(base / "four", 4)
    by_four = run_torchrun(SCRIPT, four, base / "out-4", feed(4, 1), nproc=4, TEST_EPOCHS="1")
    two = job_root(base / "two", 2)
    shutil.copytree(four / "checkpoints", two / "checkpoints")  # a new job, the same checkpoint prefix
    on_two = run_torchrun(SCRIPT, two, base / "out-2", feed(2, 1), TEST_EPOCHS="2")
    again = job_root(base / "four-again", 4)
    shutil.copytree(two / "checkpoints", again / "checkpoints")
    on_four = run_torchrun(SCRIPT, again, base / "out-4-again", feed(4, 1), nproc=4, TEST_EPOCHS="3")
    return by_four, on_two, on_four, two


def test_a_checkpoint_of_4_ranks_resumes_on_2(resharded):
    by_four, on_two, _, two = resharded
    assert by_four.proc.returncode == 0, by_four.output[-4000:]
    assert on_two.proc.returncode == 0, on_two.output[-4000:]
    meta = json.loads((two / "checkpoints" / "epoch-00001" / "meta.json").read_text())
    assert meta["world_size"] == 4
    assert sorted(meta["files"]) == [f"__{r}_0.distcp" for r in range(4)] + ["dcp.metadata"]
    for rank in (0, 1):
        (restored,) = on_two.events(rank, "restored")
        assert restored["resumed_at"] == [1, 0] and restored["world_size"] == 2
        assert restored["lr_step"] == 5
    assert_same_state(state(by_four.out / "state-final.pt"), state(on_two.out / "state-restored.pt"))


def test_a_checkpoint_of_2_ranks_resumes_on_4(resharded):
    _, on_two, on_four, _ = resharded
    assert on_four.proc.returncode == 0, on_four.output[-4000:]
    for rank in range(4):
        (restored,) = on_four.events(rank, "restored")
        assert restored["resumed_at"] == [2, 0] and restored["world_size"] == 4
        assert restored["lr_step"] == 10
        assert restored["state"] == {"batches_seen": 10}
    assert_same_state(state(on_two.out / "state-final.pt"), state(on_four.out / "state-restored.pt"))


# --- a planted checkpoint: every rank refuses it at once, and nothing in it runs ---


class Planted:
    """Unpickling it makes the directory ``marker``: code from the checkpoint prefix, running."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        import os

        return (os.mkdir, (self.marker,))


def test_a_planted_checkpoint_fails_every_rank_and_never_runs(tmp_path):
    import pickle

    root = job_root(tmp_path, 2)
    planted = root / "checkpoints" / "epoch-00001"
    planted.mkdir(parents=True)
    marker = tmp_path / "ran"
    (planted / "dcp.metadata").write_bytes(pickle.dumps(Planted(marker)))
    meta = {"format": "torch-dcp", "epoch": 1, "step": 0, "files": {"dcp.metadata": 0}}
    meta["files"]["dcp.metadata"] = (planted / "dcp.metadata").stat().st_size  # complete, as far as it says
    (planted / "meta.json").write_text(json.dumps(meta))
    job = run_torchrun(SCRIPT, root, tmp_path / "out", feed(2, 1), TEST_EPOCHS="2")
    assert job.proc.returncode != 0
    assert job.seconds < 60  # no rank waits for a peer that refused
    for rank in (0, 1):
        assert f"sagemaker-dist: rank {rank} (host" in job.proc.stderr
    assert job.proc.stderr.count("UnsafeCheckpointError") >= 2
    assert "dcp.metadata is not DCP metadata built from its own classes" in job.proc.stderr
    assert not marker.exists()
    assert job.events(0, "step") == []  # nothing trained
