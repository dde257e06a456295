"""The horovodrun script of test_shuffled_keras_resume.py: horovod_keras without record counts over
``rank_dataset(..., shuffle=)``, records with an ``id``. The model's train step appends the ids of each
batch it trains to ``OUT/trained-rank<R>.jsonl`` (attempt, epoch, ids); a start line says where the
attempt resumes. ``STOP_AT_AGREEMENT=N``: rank 0 asks for a stop at its N-th per-step agreement (a stop
agreed at a chosen step, as a SIGTERM would be). Usage: OUT ATTEMPT EPOCHS BATCH SEED WINDOW
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import tensorflow as tf

from sagemaker_dist.runtime import horovod_keras, rank_dataset
from sagemaker_dist.runtime.framing.shuffle import ShuffleWindow

FEATURES = {"id": tf.io.FixedLenFeature([], tf.int64)}


def main() -> None:
    out, attempt = Path(sys.argv[1]), sys.argv[2]
    epochs, batch, seed, window = (int(a) for a in sys.argv[3:7])
    hv = horovod_keras.setup(tf.keras.optimizers.legacy.SGD, learning_rate=0.01, batch_size=batch)
    trained = open(out / f"trained-rank{hv.rank}.jsonl", "a")
    trained.write(json.dumps({"attempt": attempt, "start": [hv.initial_epoch, hv.resume_step]}) + "\n")
    trained.flush()
    state = {"epoch": None}

    def note(ids):
        line = {"attempt": attempt, "epoch": state["epoch"], "ids": ids.numpy().tolist()}
        trained.write(json.dumps(line) + "\n")
        trained.flush()
        return 0

    class Tracked(tf.keras.Model):
        def train_step(self, data):
            x, y, ids = data
            with tf.control_dependencies([tf.py_function(note, [ids], tf.int64)]):
                x = tf.identity(x)
            return super().train_step((x, y))

    class Epochs(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            state["epoch"] = epoch

    stop_at = int(os.environ.get("STOP_AT_AGREEMENT", "0"))
    if stop_at and hv.rank == 0 and hv.resume_from is None:
        asked, wanted = [0], hv.stop.wanted

        def counting():
            asked[0] += 1
            if asked[0] == stop_at:
                hv.stop.request("STOP_AT_AGREEMENT")
            return wanted()

        hv.stop.wanted = counting

    def parse(serialized):
        ident = tf.io.parse_single_example(serialized, FEATURES)["id"]
        return tf.reshape(tf.cast(ident, tf.float32), [1]), tf.constant(0, tf.int64), ident

    inputs = tf.keras.Input((1,))
    model = Tracked(inputs, tf.keras.layers.Dense(2)(inputs))
    model.compile(hv.optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    shuffle = ShuffleWindow(seed, records=window)
    ds = rank_dataset("train", "TFRecord", shuffle=shuffle).map(parse).batch(batch, drop_remainder=True)
    model.fit(hv.train_epoch(ds), epochs=epochs, **hv.fit_kwargs(callbacks=[Epochs()]))
    print(f"rank {hv.rank}: finished", flush=True)


if __name__ == "__main__":
    main()
