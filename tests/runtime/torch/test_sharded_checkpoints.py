"""Sharded (DCP) checkpoints in one process: what a checkpoint must be to count, and what never runs.

The jobs of several ranks are in ``test_torch_fsdp_jobs.py``; here one process saves and restores
through the same ``ShardedCheckpoints`` (DCP without a process group), and planted files show that
nothing in a checkpoint directory runs code when it is read.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest

from sagemaker_dist.runtime.checkpoint_format import CheckpointMismatchError, list_checkpoints

torch = pytest.importorskip("torch")

from sagemaker_dist.runtime.torch.checkpointing import (  # noqa: E402 - after the importorskip
    UnsafeCheckpointError,
    save_torch_checkpoint,
)
from sagemaker_dist.runtime.torch.sharded import (  # noqa: E402
    METADATA_FILE,
    ShardedCheckpoints,
    is_sharded,
    read_metadata_file,
    read_sharded_checkpoint,
)

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::UserWarning")]


class Planted:
    """What an attacker pickles: unpickling it makes the directory ``marker`` (code that runs)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def parts(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return model, optimizer, scheduler


def train(model, optimizer, scheduler, steps: int) -> None:
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(3, 4)).pow(2).mean().backward()
        optimizer.step()
        scheduler.step()


def checkpoints(directory: Path, model, optimizer, scheduler) -> ShardedCheckpoints:
    return ShardedCheckpoints(directory, model=model, optimizer=optimizer, scheduler=scheduler, keep=None)


def snapshot(model, optimizer) -> dict:
    return {
        "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "optim": {
            i: {k: v.clone() for k, v in s.items()}
            for i, s in enumerate(optimizer.state_dict()["state"].values())
        },
    }


def assert_snapshot(model, optimizer, expected: dict) -> None:
    got = snapshot(model, optimizer)
    for name, tensor in expected["model"].items():
        assert torch.equal(tensor, got["model"][name]), name
    for index, moments in expected["optim"].items():
        for key, value in moments.items():
            assert torch.equal(value, got["optim"][index][key]), (index, key)


@pytest.fixture
def saved(tmp_path):
    """A complete checkpoint after 3 steps (``epoch-00000-step-000003``) and the state it holds."""
    model, optimizer, scheduler = parts()
    train(model, optimizer, scheduler, 3)
    written = checkpoints(tmp_path, model, optimizer, scheduler).save(0, 3, extra={"state": {"seen": 12}})
    return written, snapshot(model, optimizer)


def test_a_checkpoint_restores_model_optimizer_scheduler_and_extras(tmp_path, saved):
    written, expected = saved
    assert written.path == tmp_path / "epoch-00000-step-000003"
    assert sorted(json.loads((written.path / "meta.json").read_text())["files"]) == [
        "__0_0.distcp",
        METADATA_FILE,
    ]
    model, optimizer, scheduler = parts(seed=1)  # other weights: the restore must replace them all
    epoch, step, found, meta = checkpoints(tmp_path, model, optimizer, scheduler).restore()
    assert (epoch, step, found.path) == (0, 3, written.path)
    assert meta["extra"] == {"state": {"seen": 12}}
    assert scheduler.last_epoch == 3 and scheduler.get_last_lr() == [0.005]
    assert_snapshot(model, optimizer, expected)
    whole = read_sharded_checkpoint(written.path)
    assert torch.equal(whole["model"]["0.weight"], expected["model"]["0.weight"])


def test_an_async_save_holds_the_state_it_was_given_while_training_goes_on(tmp_path):
    model, optimizer, scheduler = parts()
    train(model, optimizer, scheduler, 2)
    expected = snapshot(model, optimizer)
    saver = checkpoints(tmp_path, model, optimizer, scheduler)
    assert saver.save(0, 2, blocking=False) is None  # staged: the write goes on in the background
    train(model, optimizer, scheduler, 3)  # while it is written
    assert saver.wait() is True
    assert saver.committed == (0, 2)
    model2, optimizer2, scheduler2 = parts(seed=1)
    checkpoints(tmp_path, model2, optimizer2, scheduler2).restore()
    assert_snapshot(model2, optimizer2, expected)
    assert scheduler2.last_epoch == 2


def test_incomplete_or_half_written_checkpoints_never_count(tmp_path, saved):
    written, expected = saved
    truncated = tmp_path / "epoch-00001"
    shutil.copytree(written.path, truncated)
    meta = json.loads((truncated / "meta.json").read_text())
    meta.update(epoch=1, step=0)
    (truncated / "meta.json").write_text(json.dumps(meta))
    with open(truncated / "__0_0.distcp", "r+b") as fh:
        fh.truncate(100)  # a shard cut short (a half-synced copy): its size is not the listed one
    unmarked = tmp_path / "epoch-00002"
    shutil.copytree(written.path, unmarked)
    (unmarked / "meta.json").unlink()  # shards without the commit marker
    half = tmp_path / ".tmp-epoch-00003-0badc0de-1"
    shutil.copytree(written.path, half)  # a writer that never renamed
    assert [c.path.name for c in list_checkpoints(tmp_path)] == ["epoch-00000-step-000003"]
    model, optimizer, scheduler = parts(seed=1)
    epoch, step, found, _ = checkpoints(tmp_path, model, optimizer, scheduler).restore()
    assert (epoch, step, found.path.name) == (0, 3, "epoch-00000-step-000003")
    assert_snapshot(model, optimizer, expected)
    assert not half.exists()  # a crashed writer's leftovers are cleared at start


def _relist(path: Path) -> None:
    """Make ``meta.json`` list the directory's files as they are: a planted checkpoint looks complete."""
    meta = json.loads((path / "meta.json").read_text())
    meta["files"] = {p.name: p.stat().st_size for p in path.iterdir() if p.name != "meta.json"}
    (path / "meta.json").write_text(json.dumps(meta))


def test_a_planted_metadata_pickle_is_refused_and_never_runs(tmp_path, saved):
    written, _ = saved
    marker = tmp_path.parent / f"{tmp_path.name}-ran"
    (written.path / METADATA_FILE).write_bytes(pickle.dumps(Planted(marker)))
    _relist(written.path)
    model, optimizer, scheduler = parts()
    with pytest.raises(
        UnsafeCheckpointError, match=r"dcp\.metadata .*posix\.mkdir|dcp\.metadata .*os\.mkdir"
    ):
        checkpoints(tmp_path, model, optimizer, scheduler).restore()
    with pytest.raises(UnsafeCheckpointError):
        read_sharded_checkpoint(written.path)
    assert not marker.exists()


def test_a_planted_value_in_a_shard_is_refused_and_never_runs(tmp_path, saved):
    """DCP reads a checkpoint's plain values (the optimizer's hyperparameters) with ``torch.load``;
    its own planner allows any object there. A shard whose value unpickles into code is refused."""
    written, _ = saved
    payload = io.BytesIO()
    torch.save(Planted(tmp_path.parent / f"{tmp_path.name}-live"), payload)
    torch.load(io.BytesIO(payload.getvalue()), weights_only=False)  # the payload is live: it runs
    assert (tmp_path.parent / f"{tmp_path.name}-live").is_dir()
    marker = tmp_path.parent / f"{tmp_path.name}-ran"
    payload = io.BytesIO()
    torch.save(Planted(marker), payload)
    (written.path / "__0_9.distcp").write_bytes(payload.getvalue())
    metadata = read_metadata_file(written.path / METADATA_FILE)
    (index,) = [i for i in metadata.storage_data if i.fqn == "optim.param_groups.0.lr"]
    info = metadata.storage_data[index]
    metadata.storage_data[index] = type(info)("__0_9.distcp", 0, len(payload.getvalue()))
    (written.path / METADATA_FILE).write_bytes(pickle.dumps(metadata))
    _relist(written.path)
    model, optimizer, scheduler = parts()
    with pytest.raises(UnsafeCheckpointError, match="optim.param_groups.0.lr"):
        checkpoints(tmp_path, model, optimizer, scheduler).restore()
    assert not marker.exists()


def test_a_shard_outside_the_checkpoint_is_refused(tmp_path, saved):
    written, _ = saved
    outside = tmp_path.parent / f"{tmp_path.name}-outside.distcp"
    shutil.copy(written.path / "__0_0.distcp", outside)
    metadata = read_metadata_file(written.path / METADATA_FILE)
    for index, info in list(metadata.storage_data.items()):
        metadata.storage_data[index] = type(info)(f"../{outside.name}", info.offset, info.length)
    (written.path / METADATA_FILE).write_bytes(pickle.dumps(metadata))
    _relist(written.path)
    model, optimizer, scheduler = parts()
    with pytest.raises(
        UnsafeCheckpointError, match=r"names shard '\.\./.*outside\.distcp', which meta\.json"
    ):
        checkpoints(tmp_path, model, optimizer, scheduler).restore()


def test_extras_json_cannot_carry_are_refused_when_saving(tmp_path):
    model, optimizer, scheduler = parts()
    saver = checkpoints(tmp_path, model, optimizer, scheduler)
    with pytest.raises(UnsafeCheckpointError, match=r"extra= cannot go into a sharded checkpoint"):
        saver.save(0, 1, extra={"state": {"when": object()}})
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_a_whole_model_checkpoint_is_not_restored_into_a_sharded_job(tmp_path):
    model, optimizer, scheduler = parts()
    save_torch_checkpoint(tmp_path, 1, model=model, optimizer=optimizer)
    with pytest.raises(CheckpointMismatchError, match=r"format 'torch'.*sharded \(FSDP2\)"):
        checkpoints(tmp_path, model, optimizer, scheduler).restore()


def test_a_model_is_sharded_when_fully_shard_was_applied(tmp_path):
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from sagemaker_dist.runtime.torch.training import PipeTraining

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
        assert not is_sharded(model)
        fully_shard(model[0])
        assert is_sharded(model)  # one sharded submodule is enough: DDP's whole-model save cannot serve it
        with pytest.raises(ValueError, match="join=True .* FSDP2 models do not support"):
            PipeTraining(None, model, epochs=1, join=True)
    finally:
        dist.destroy_process_group()


def _save_without_restore(rank: int, store: str, directory: str) -> None:
    """One of 2 Gloo ranks: a save before any restore (a loop of its own, not PipeTraining's)."""
    import torch.distributed as dist
    import torch.distributed.nn  # noqa: F401 - before the group, as docs/tasks/sharded-models.md asks

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        model, optimizer, scheduler = parts()
        saver = ShardedCheckpoints(
            directory, model=model, optimizer=optimizer, rank=rank, local_rank=rank, world_size=2
        )
        saver.save(0, 1)
    finally:
        dist.destroy_process_group()


def test_ranks_that_save_before_any_restore_write_into_one_checkpoint(tmp_path):
    """Every rank names the temporary directory alike (rank 0's token), restored or not."""
    import torch.multiprocessing as mp

    mp.spawn(_save_without_restore, args=(str(tmp_path / "store"), str(tmp_path / "ckpt")), nprocs=2)
    (written,) = list_checkpoints(tmp_path / "ckpt")
    assert sorted(p.name for p in written.path.iterdir()) == [
        "__0_0.distcp",
        "__1_0.distcp",
        METADATA_FILE,
        "meta.json",
    ]
    assert not list((tmp_path / "ckpt").glob(".tmp-*"))
    assert sorted(read_sharded_checkpoint(written.path)["model"]) == [
        "0.bias",
        "0.weight",
        "2.bias",
        "2.weight",
    ]
