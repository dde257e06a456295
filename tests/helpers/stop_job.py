"""Training script for tests/runtime/test_stop_resume.py, run under ``horovodrun -np 2 --gloo``.

horovod_keras without record counts; every record carries an ``id``. The model's train step appends
the ids of each batch it trains to ``OUT/trained-rank<R>.jsonl`` (one line per batch: attempt, epoch,
ids), so the test counts what was trained, not what was read ahead. A step sleeps ``STEP_SLEEP`` s so a
SIGTERM lands mid-epoch. Usage: stop_job.py OUT_DIR ATTEMPT EPOCHS BATCH STEP_SLEEP [EVERY_STEPS]
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import tensorflow as tf

from sagemaker_dist.runtime import horovod_keras, rank_dataset

FEATURES = {
    "image": tf.io.FixedLenFeature([], tf.string),
    "label": tf.io.FixedLenFeature([], tf.int64),
    "id": tf.io.FixedLenFeature([], tf.int64),
}


def main() -> None:
    out, attempt, epochs, batch, pause = (
        Path(sys.argv[1]),
        sys.argv[2],
        int(sys.argv[3]),
        int(sys.argv[4]),
        float(sys.argv[5]),
    )
    every = int(sys.argv[6]) if len(sys.argv) > 6 else None
    hv = horovod_keras.setup(
        tf.keras.optimizers.legacy.SGD, learning_rate=0.01, batch_size=batch, checkpoint_every_steps=every
    )
    (out / f"pid-rank{hv.rank}").write_text(str(os.getpid()))
    trained = open(out / f"trained-rank{hv.rank}.jsonl", "a")
    state = {"epoch": None}

    def note(ids):
        trained.write(
            json.dumps({"attempt": attempt, "epoch": state["epoch"], "ids": ids.numpy().tolist()}) + "\n"
        )
        trained.flush()
        time.sleep(pause)
        return 0

    class Tracked(tf.keras.Model):
        def train_step(self, data):
            x, y, ids = data
            done = tf.py_function(note, [ids], tf.int64)
            with tf.control_dependencies([done]):
                x = tf.identity(x)
            return super().train_step((x, y))

    class Epochs(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            state["epoch"] = epoch

    # STOP_AT_AGREEMENT=N: rank 0 wants to stop from the N-th per-step agreement on (each batch's, and
    # each epoch's end marker's): a stop agreed at a chosen step, whatever tf.data reads ahead
    stop_at = int(os.environ.get("STOP_AT_AGREEMENT", "0"))
    if stop_at and hv.rank == 0:
        asked, wanted = [0], hv.stop.wanted

        def counting():
            asked[0] += 1
            if asked[0] == stop_at:
                hv.stop.request("STOP_AT_AGREEMENT")
            return wanted()

        hv.stop.wanted = counting

    def parse(serialized):
        parsed = tf.io.parse_single_example(serialized, FEATURES)
        image = (
            tf.cast(tf.reshape(tf.io.decode_raw(parsed["image"], tf.uint8), (32, 32, 3)), tf.float32) / 255.0
        )
        return image, parsed["label"], parsed["id"]

    inputs = tf.keras.Input((32, 32, 3))
    x = tf.keras.layers.Conv2D(4, 3, activation="relu")(inputs)
    x = tf.keras.layers.GlobalAveragePooling2D()(x)
    model = Tracked(inputs, tf.keras.layers.Dense(10)(x))
    model.compile(hv.optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ds = rank_dataset("train", "TFRecord").map(parse).batch(batch, drop_remainder=True)
    print(f"rank {hv.rank}: initial_epoch {hv.initial_epoch} resume_step {hv.resume_step}", flush=True)
    (out / f"start-rank{hv.rank}-attempt{attempt}.json").write_text(
        json.dumps({"initial_epoch": hv.initial_epoch, "resume_step": hv.resume_step})
    )
    model.fit(hv.train_epoch(ds), epochs=epochs, **hv.fit_kwargs(callbacks=[Epochs()]))
    print(f"rank {hv.rank}: finished", flush=True)
    (out / f"finished-rank{hv.rank}-attempt{attempt}").write_text("ok")


if __name__ == "__main__":
    main()
