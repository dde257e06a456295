"""TensorBoardSyncer against a real moto S3 server: uploads while training runs, survives S3 outages."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from sagemaker_dist.runtime.tensorboard_sync import TensorBoardSyncer, split_s3_uri, start_tensorboard_sync


def _wait(predicate, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _objects(s3, bucket, prefix=""):
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", [])}


def _tiny_model():
    import tensorflow as tf

    model = tf.keras.Sequential([tf.keras.Input(shape=(4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.legacy.SGD(0.01), loss="mse")
    return model


def test_split_s3_uri():
    assert split_s3_uri("s3://tb-bucket/some/prefix/") == ("tb-bucket", "some/prefix")
    assert split_s3_uri("s3://tb-bucket") == ("tb-bucket", "")
    for bad in ("b/prefix", "s3://", "s3:///x", None, "s3://b/x"):  # 'b': bucket names have 3+ characters
        with pytest.raises(ValueError, match="s3://|bucket"):
            split_s3_uri(bad)


def test_only_rank_zero_syncs(tmp_path, aws_env, bucket):
    assert start_tensorboard_sync(tmp_path, f"s3://{bucket}/tb", rank=1) is None
    assert start_tensorboard_sync(tmp_path, None, rank=0) is None


def test_new_and_changed_files_uploaded_in_background_and_flushed_at_stop(tmp_path, s3, bucket):
    logs = tmp_path / "logs"
    (logs / "train").mkdir(parents=True)
    events = logs / "train" / "events.out.tfevents.1"
    events.write_bytes(b"a" * 10)
    syncer = TensorBoardSyncer(logs, f"s3://{bucket}/job/tb", interval=0.1).start()
    try:
        assert _wait(lambda: _objects(s3, bucket).get("job/tb/train/events.out.tfevents.1") == 10)
        with events.open("ab") as fh:  # TensorBoard appends to its event files
            fh.write(b"b" * 20)
        assert _wait(lambda: _objects(s3, bucket).get("job/tb/train/events.out.tfevents.1") == 30)
        # a round is counted when it has finished, just after its last object landed (a race seen in CI)
        assert _wait(lambda: syncer.uploads == 2)
        uploads = syncer.uploads
        time.sleep(0.4)  # several idle rounds: unchanged files are not uploaded again
        assert syncer.uploads == uploads
        (logs / "late.txt").write_text("written just before the end")
    finally:
        assert syncer.stop(timeout=30)
    # the final flush at stop() uploaded the file written last, whatever the interval
    assert _objects(s3, bucket)["job/tb/late.txt"] == len("written just before the end")
    body = s3.get_object(Bucket=bucket, Key="job/tb/train/events.out.tfevents.1")["Body"].read()
    assert body == b"a" * 10 + b"b" * 20
    assert syncer.failures == 0 and syncer.cpu_seconds > 0


def test_final_flush_at_interpreter_exit(tmp_path, s3, bucket, aws_env):
    script = (
        "import sys, pathlib\n"
        "from sagemaker_dist.runtime.tensorboard_sync import TensorBoardSyncer\n"
        "logs = pathlib.Path(sys.argv[1]); logs.mkdir()\n"
        "TensorBoardSyncer(logs, sys.argv[2], interval=600).start()\n"
        "(logs / 'events.out.tfevents.9').write_bytes(b'e' * 7)\n"  # only the exit flush can upload it
        "print('exiting without stop()')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "logs"), f"s3://{bucket}/exit"],
        env={**os.environ, **aws_env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert _objects(s3, bucket) == {"exit/events.out.tfevents.9": 7}, done.stderr


def test_epoch_events_visible_in_s3_while_training_runs(tmp_path, s3, bucket):
    import tensorflow as tf

    logs = tmp_path / "tb"
    syncer = TensorBoardSyncer(logs, f"s3://{bucket}/tb", interval=60.0).start()  # only epoch-end syncs
    tensorboard = tf.keras.callbacks.TensorBoard(log_dir=str(logs), profile_batch=0)
    seen_during_training = []

    def epoch_loss_in_s3():
        for key in _objects(s3, bucket, "tb/train/"):
            if b"epoch_loss" in s3.get_object(Bucket=bucket, Key=key)["Body"].read():
                return True
        return False

    class LookAtS3(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1:  # epoch 0 has ended, training has not
                seen_during_training.append(_wait(epoch_loss_in_s3, timeout=20))

    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    model = _tiny_model()
    model.fit(
        x,
        x[:, :1],
        epochs=2,
        batch_size=16,
        verbose=0,
        callbacks=[tensorboard, syncer.keras_callback(tensorboard), LookAtS3()],
    )
    assert seen_during_training == [True]
    assert syncer.failures == 0
    assert syncer._thread is None  # on_train_end stopped it after the final flush


def test_s3_down_training_ends_fine_and_error_is_logged(tmp_path, aws_env, monkeypatch, caplog):
    with socket.socket() as s:  # a port nobody listens on: every S3 call is refused
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", dead)
    logs = tmp_path / "tb"
    logs.mkdir()
    (logs / "events.out.tfevents.0").write_bytes(b"x" * 100)
    syncer = TensorBoardSyncer(
        logs, "s3://unreachable-bucket/tb", interval=0.2, max_attempts=2, flush_timeout=20
    ).start()
    x = np.random.default_rng(1).normal(size=(32, 4)).astype("float32")
    caplog.set_level(logging.ERROR, logger="sagemaker_dist.runtime.tensorboard_sync")
    history = _tiny_model().fit(
        x, x[:, :1], epochs=3, batch_size=8, verbose=0, callbacks=[syncer.keras_callback()]
    )
    assert len(history.history["loss"]) == 3
    assert syncer.failures >= 1
    assert syncer.uploads == 0
    assert "TensorBoard sync to s3://unreachable-bucket/tb failed" in caplog.text
    assert "127.0.0.1" in str(syncer.last_error)


def test_blackholed_s3_costs_one_flush_timeout_at_most(tmp_path, aws_env):
    """An endpoint that accepts connections and never answers: stop() gives up after flush_timeout,
    and the interpreter then exits at once (the exit handler does not wait a second time)."""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(16)  # accepted by the kernel, never read, never answered
        script = (
            "import sys, time, pathlib\n"
            "from sagemaker_dist.runtime.tensorboard_sync import TensorBoardSyncer\n"
            "logs = pathlib.Path(sys.argv[1]); logs.mkdir()\n"
            "(logs / 'events.out.tfevents.1').write_bytes(b'e' * 7)\n"
            "syncer = TensorBoardSyncer(logs, 's3://tb-bucket/tb', interval=600, flush_timeout=3).start()\n"
            "t0 = time.monotonic(); finished = syncer.stop()\n"
            "print('stopped', finished, round(time.monotonic() - t0, 1), flush=True)\n"
        )
        env = {**os.environ, **aws_env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{hole.getsockname()[1]}"}
        proc = subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path / "logs")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = proc.stdout.readline()
        stopped_at = time.monotonic()
        proc.wait(timeout=60)
        exit_wait = time.monotonic() - stopped_at
    assert line.split()[:2] == ["stopped", "False"], line + proc.stderr.read()
    assert 2.5 <= float(line.split()[2]) < 6
    assert exit_wait < 2.5, f"the interpreter waited {exit_wait:.1f} s more at exit"


def test_bad_interval_rejected(tmp_path):
    with pytest.raises(ValueError, match="interval"):
        TensorBoardSyncer(tmp_path, "s3://tb-bucket/p", interval=0)
