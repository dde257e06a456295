"""Test entry script for local spot interruptions: horovod_keras without record counts on records
with an ``id``; each rank appends to ``--out``/trained-rank<R>.jsonl a start line (pid, the epoch and
step it resumes at) and one line per batch its train step trains (epoch, ids). ``--pause`` slows a step;
``--stop_after_steps N`` has rank 0 ask for a stop at the N-th step (mwms: each step asks once);
``--shuffle_seed S`` reads the channel through the seeded shuffle window (``--shuffle_window`` records).
"""

import argparse
import json
import os
import time
from pathlib import Path

import tensorflow as tf

from sagemaker_dist.runtime import ShuffleWindow, horovod_keras, mwms_keras, rank_dataset

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--batch_size", type=int, default=4)
p.add_argument("--pause", type=float, default=0.1)
p.add_argument("--helper", default="horovod", help="horovod or mwms")
p.add_argument("--stop_after_steps", type=int, default=0, help="rank 0 of a fresh job asks to stop then")
p.add_argument("--train_records", type=int, default=0, help="records in each rank's shard (counted epochs)")
p.add_argument("--shuffle_seed", type=int, default=-1, help="the reader's shuffle window's seed (-1: none)")
p.add_argument("--shuffle_window", type=int, default=4096, help="records in the reader's shuffle window")
args, _ = p.parse_known_args()

FEATURES = {
    "image": tf.io.FixedLenFeature([], tf.string),
    "label": tf.io.FixedLenFeature([], tf.int64),
    "id": tf.io.FixedLenFeature([], tf.int64),
}
mwms = args.helper == "mwms"
helper, optimizer = (
    (mwms_keras, tf.keras.optimizers.SGD) if mwms else (horovod_keras, tf.keras.optimizers.legacy.SGD)
)
counted = {"train_records": args.train_records} if args.train_records else {}
hv = helper.setup(optimizer, learning_rate=0.01, batch_size=args.batch_size, **counted)
trained = open(Path(args.out) / f"trained-rank{hv.rank}.jsonl", "a")
trained.write(json.dumps({"start": os.getpid(), "epoch": hv.initial_epoch, "step": hv.resume_step}) + "\n")
trained.flush()
state = {"epoch": None}
if args.stop_after_steps and hv.rank == 0 and hv.resume_from is None:  # as if SIGTERM came at that step
    asked, wanted = [0], hv.stop.wanted

    def counting():
        asked[0] += 1
        if asked[0] == args.stop_after_steps:
            hv.stop.request("--stop_after_steps")
        return wanted()

    hv.stop.wanted = counting


def note(ids):
    trained.write(
        json.dumps({"pid": os.getpid(), "epoch": state["epoch"], "ids": ids.numpy().tolist()}) + "\n"
    )
    trained.flush()
    time.sleep(args.pause)
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


def parse(serialized):
    parsed = tf.io.parse_single_example(serialized, FEATURES)
    image = tf.cast(tf.reshape(tf.io.decode_raw(parsed["image"], tf.uint8), (32, 32, 3)), tf.float32) / 255.0
    return image, parsed["label"], parsed["id"]


with hv.scope():
    inputs = tf.keras.Input((32, 32, 3))
    x = tf.keras.layers.GlobalAveragePooling2D()(tf.keras.layers.Conv2D(4, 3, activation="relu")(inputs))
    model = Tracked(inputs, tf.keras.layers.Dense(10)(x))
    model.compile(hv.optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
shuffle = ShuffleWindow(args.shuffle_seed, records=args.shuffle_window) if args.shuffle_seed >= 0 else None
ds = rank_dataset("train", "TFRecord", shuffle=shuffle).map(parse).batch(args.batch_size, drop_remainder=True)
model.fit(hv.train_epoch(ds), epochs=args.epochs, **hv.fit_kwargs(callbacks=[Epochs()]))
print(f"rank {hv.rank}: finished", flush=True)
