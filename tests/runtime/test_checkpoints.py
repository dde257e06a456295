"""Rank-0 checkpoints: atomic writes, only complete ones resumed, pruning, restore at train begin.

Single process with real TensorFlow (Horovod not initialised, so the epoch broadcast is the identity);
the two-rank broadcast is covered by tests/runtime/test_horovod_training.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from sagemaker_dist.runtime.checkpoint_format import (
    CheckpointMismatchError,
    checkpoint_dir,
    latest_checkpoint,
    list_checkpoints,
    remove_stale_temporaries,
)
from sagemaker_dist.runtime.tensorflow.keras.callbacks import checkpoint_callback
from sagemaker_dist.runtime.tensorflow.keras.checkpoints import (
    restore_checkpoint,
    resume_point,
    resume_position,
    save_checkpoint,
)


def _model(seed=0, units=(2, 1)):
    import tensorflow as tf

    tf.keras.utils.set_random_seed(seed)
    model = tf.keras.Sequential([tf.keras.Input(shape=(3,))] + [tf.keras.layers.Dense(n) for n in units])
    model.compile(optimizer=tf.keras.optimizers.legacy.Adam(0.01), loss="mse")
    return model


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 3)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


def _same(a, b):
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_checkpoint_dir_from_argument_environment_or_default(tmp_path, monkeypatch):
    monkeypatch.delenv("SAGEMAKER_DIST_OPT_ML", raising=False)
    assert str(checkpoint_dir()) == "/opt/ml/checkpoints"
    monkeypatch.setenv("SAGEMAKER_DIST_OPT_ML", str(tmp_path / "env"))
    assert checkpoint_dir() == tmp_path / "env" / "checkpoints"
    assert checkpoint_dir(tmp_path / "arg") == tmp_path / "arg" / "checkpoints"


def test_save_then_restore_model_and_optimizer_state(tmp_path):
    x, y = _data()
    model = _model(0)
    model.fit(x, y, epochs=2, batch_size=8, verbose=0)
    saved = save_checkpoint(model, tmp_path, 2)
    assert saved == latest_checkpoint(tmp_path)
    meta = json.loads((saved.path / "meta.json").read_text())
    assert (
        meta["epoch"] == 2
        and meta["rank"] == 0
        and set(meta["files"]) == {p.name for p in saved.path.iterdir() if p.name != "meta.json"}
    )

    fresh = _model(1)
    assert not _same(fresh.get_weights(), model.get_weights())
    restored = restore_checkpoint(fresh, saved)
    assert _same(fresh.get_weights(), model.get_weights())
    # optimizer slots and step count come back when the optimizer creates them (deferred restore)
    model.fit(x, y, epochs=1, batch_size=8, verbose=0, shuffle=False)
    fresh.fit(x, y, epochs=1, batch_size=8, verbose=0, shuffle=False)
    restored.assert_complete()  # every value in the checkpoint found its variable
    assert int(fresh.optimizer.iterations.numpy()) == int(model.optimizer.iterations.numpy()) == 12
    for a, b in zip(fresh.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_only_complete_checkpoints_count(tmp_path):
    model = _model()
    good = save_checkpoint(model, tmp_path, 1, keep=None)
    truncated = save_checkpoint(model, tmp_path, 2, keep=None)
    data_file = next(p for p in truncated.path.iterdir() if p.name.startswith("ckpt.data"))
    data_file.write_bytes(data_file.read_bytes()[:-1])  # e.g. a half-synced copy from S3
    no_meta = save_checkpoint(model, tmp_path, 3, keep=None)
    (no_meta.path / "meta.json").unlink()
    wrong_name = save_checkpoint(model, tmp_path, 4, keep=None)
    wrong_name.path.rename(tmp_path / "epoch-00005")  # meta says 4: not trusted
    (tmp_path / ".tmp-epoch-00009-abc").mkdir()
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    assert list_checkpoints(tmp_path) == [good]
    assert latest_checkpoint(tmp_path) == good
    assert resume_point(tmp_path, rank=0) == (1, good)
    assert latest_checkpoint(tmp_path / "missing") is None
    assert resume_point(tmp_path / "missing", rank=0) == (0, None)


def test_failed_write_leaves_no_trace(tmp_path):
    with pytest.raises(ValueError):
        save_checkpoint(object(), tmp_path, 1)  # not trackable: tf.train.Checkpoint refuses it
    assert list(tmp_path.iterdir()) == []


def test_rewriting_an_epoch_replaces_it(tmp_path):
    x, y = _data()
    model = _model()
    save_checkpoint(model, tmp_path, 3)
    model.fit(x, y, epochs=1, verbose=0)
    again = save_checkpoint(model, tmp_path, 3)
    fresh = _model(5)
    restore_checkpoint(fresh, again)
    assert _same(fresh.get_weights(), model.get_weights())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch-00003"]


def test_callback_writes_on_rank0_only_every_n_epochs_and_prunes(tmp_path):
    x, y = _data()
    rank1_dir, rank0_dir = tmp_path / "r1", tmp_path / "r0"
    _model().fit(x, y, epochs=3, verbose=0, callbacks=[checkpoint_callback(rank1_dir, rank=1)])
    assert not rank1_dir.exists()
    callback = checkpoint_callback(rank0_dir, rank=0, keep=2, every=2)
    _model().fit(x, y, epochs=7, verbose=0, callbacks=[callback])
    assert [c.epoch for c in list_checkpoints(rank0_dir)] == [4, 6]
    with pytest.raises(ValueError, match="every"):
        checkpoint_callback(rank0_dir, rank=0, every=0)


def test_resume_restores_at_train_begin_and_clears_crashed_writes(tmp_path):
    x, y = _data()
    first = _model(0)
    first.fit(x, y, epochs=2, verbose=0, callbacks=[checkpoint_callback(tmp_path, rank=0)])
    (tmp_path / ".tmp-epoch-00003-crashed").mkdir()
    initial_epoch, found = resume_point(tmp_path, rank=0)
    assert (initial_epoch, found.epoch) == (2, 2)
    assert resume_point(tmp_path, rank=1) == (0, None)  # no Horovod: other ranks never read

    import tensorflow as tf

    second = _model(3)
    seen = []

    class Look(tf.keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            seen.append(_same(self.model.get_weights(), first.get_weights()))

        def on_epoch_begin(self, epoch, logs=None):
            seen.append(epoch)

    callback = checkpoint_callback(tmp_path, rank=0, resume_from=found)
    second.fit(x, y, epochs=3, initial_epoch=initial_epoch, verbose=0, callbacks=[callback, Look()])
    assert seen == [True, 2]
    assert [c.epoch for c in list_checkpoints(tmp_path)] == [1, 2, 3]
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())


def test_crash_mid_swap_puts_the_old_copy_back(tmp_path):
    """A writer that died after moving epoch-N aside and before renaming the new one in leaves only
    ``.old-epoch-N-*/epoch-N``: the clean-up restores it instead of deleting the only copy."""
    model = _model()
    save_checkpoint(model, tmp_path, 3)
    aside = tmp_path / ".old-epoch-00003-crashed"
    aside.mkdir()
    (tmp_path / "epoch-00003").rename(aside / "epoch-00003")
    (tmp_path / ".tmp-epoch-00003-halfwritten").mkdir()  # the new copy never finished
    remove_stale_temporaries(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch-00003"]
    found = latest_checkpoint(tmp_path)
    fresh = _model(7)
    restore_checkpoint(fresh, found)
    assert found.epoch == 3 and _same(fresh.get_weights(), model.get_weights())


def test_the_rename_is_fsynced_in_the_checkpoint_directory(tmp_path, monkeypatch):
    """A rename is an entry of the directory it lands in: until that directory is fsynced, a host
    crash may lose ``epoch-N`` though its files were fsynced."""
    import os

    synced = []  # (what the descriptor is, whether epoch-00001 had been renamed into place by then)
    fsync = os.fsync

    def recording_fsync(fd):
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), (tmp_path / "epoch-00001").exists()))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    save_checkpoint(_model(), tmp_path, 1)
    assert (str(tmp_path), True) in synced  # the directory, after the rename
    names = [os.path.basename(path) for path, _ in synced]
    assert any(n.startswith(".tmp-epoch-00001-") for n in names)  # the files' names in the temporary one
    assert {"ckpt.index", "meta.json"} <= set(names)  # the files themselves, as before
    synced.clear()
    save_checkpoint(_model(), tmp_path, 1)  # the same epoch again: swapped in, then synced
    assert synced[-1] == (str(tmp_path), True)


def _saved_after_training(directory):
    x, y = _data()
    model = _model(0)
    model.fit(x, y, epochs=1, batch_size=8, verbose=0)
    return save_checkpoint(model, directory, 1)


@pytest.mark.parametrize(
    "units, problem",
    [((2, 1, 1), "not bound to checkpointed values"), ((3, 1), "incompatible tensor with shape")],
    ids=["a layer more", "other shapes"],
)
def test_a_checkpoint_of_another_model_is_refused_at_restore_naming_it(tmp_path, units, problem):
    saved = _saved_after_training(tmp_path)
    with pytest.raises(CheckpointMismatchError) as refused:
        restore_checkpoint(_model(1, units), saved)
    message = str(refused.value)
    assert f"checkpoint {saved.path} (epoch 1) does not match this model and optimizer" in message
    assert problem in message and "fresh checkpoint location" in message


def test_a_checkpoint_with_more_than_the_model_fails_after_the_first_step_of_the_resumed_fit(tmp_path):
    """A smaller model matches every variable it has, so only the values left over tell: once the first
    step has made the optimizer's slots, every value in the checkpoint must have found its variable."""
    saved = _saved_after_training(tmp_path)
    x, y = _data()
    smaller = _model(1, units=(2,))  # the checkpoint's second layer has nowhere to go
    callback = checkpoint_callback(tmp_path, rank=0, resume_from=saved)
    with pytest.raises(CheckpointMismatchError, match=r"epoch-00001 \(epoch 1\) does not match.*"
                       r"Unresolved object in checkpoint"):  # fmt: skip
        smaller.fit(x, y, epochs=2, initial_epoch=1, batch_size=8, verbose=0, callbacks=[callback])
    assert int(smaller.optimizer.iterations.numpy()) == 4 + 1  # the checkpoint's 4 steps, then one more


def test_step_checkpoints_order_after_their_epoch_and_resume_with_the_step(tmp_path):
    x, y = _data()
    model = _model(0)
    model.fit(x, y, epochs=1, batch_size=8, verbose=0)
    save_checkpoint(model, tmp_path, 1, keep=None)
    stop = save_checkpoint(
        model, tmp_path, 1, step=7, keep=None, extra={"stopped": True, "records_consumed": [56, 56]}
    )
    assert stop.path.name == "epoch-00001-step-000007"
    found = list_checkpoints(tmp_path)
    assert [c.position for c in found] == [(1, 0), (1, 7)]
    assert found[-1].meta["records_consumed"] == [56, 56] and found[-1].meta["stopped"] is True
    assert resume_position(tmp_path, rank=0) == ((1, 7), found[-1])
    assert resume_point(tmp_path, rank=0) == (1, found[-1])
    save_checkpoint(model, tmp_path, 2, keep=2)  # the epoch's end outranks its steps; pruned to 2
    assert [c.position for c in list_checkpoints(tmp_path)] == [(1, 7), (2, 0)]
    (tmp_path / "epoch-00002-step-000003").mkdir()  # no meta.json: never resumed from
    assert latest_checkpoint(tmp_path).position == (2, 0)
