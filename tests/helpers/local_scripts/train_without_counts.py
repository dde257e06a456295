"""Test entry script: a small Keras model trained with horovod_keras and no record counts at all.

Prints each role's per-epoch steps (from the ranks' agreement) and a digest of the final weights, so
the test can check that every rank ended every epoch at the same step and finished with equal weights.
"""

import argparse
import hashlib

import numpy as np
import tensorflow as tf

from sagemaker_dist.runtime import horovod_keras, rank_dataset

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--batch_size", type=int, default=8)
p.add_argument("--validate", default="yes")
args, _ = p.parse_known_args()

FEATURES = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}


def parse(serialized):
    parsed = tf.io.parse_single_example(serialized, FEATURES)
    image = tf.cast(tf.reshape(tf.io.decode_raw(parsed["image"], tf.uint8), (32, 32, 3)), tf.float32) / 255.0
    return image, parsed["label"]


def batches(role):
    return rank_dataset(role, "TFRecord").map(parse).batch(args.batch_size)  # last batch may be partial


hv = horovod_keras.setup(
    tf.keras.optimizers.legacy.SGD, learning_rate=0.01, batch_size=args.batch_size, checkpoints=False
)
tf.keras.utils.set_random_seed(1)
model = tf.keras.Sequential(
    [
        tf.keras.Input((32, 32, 3)),
        tf.keras.layers.Conv2D(4, 3, activation="relu"),
        tf.keras.layers.GlobalAveragePooling2D(),
        tf.keras.layers.Dense(10),
    ]
)
model.compile(
    hv.optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"]
)
validation = hv.validation_epoch(batches("validation")) if args.validate == "yes" else None
model.fit(hv.train_epoch(batches("train")), validation_data=validation, epochs=args.epochs, **hv.fit_kwargs())
digest = hashlib.sha256(b"".join(np.asarray(w).tobytes() for w in model.get_weights())).hexdigest()[:16]
print(f"train steps {[r.steps for r in hv.train_reports.reports]}", flush=True)
print(f"train read {[list(r.records_read) for r in hv.train_reports.reports]}", flush=True)
print(f"train left {[list(r.records_left) for r in hv.train_reports.reports]}", flush=True)
print(f"validation steps {[r.steps for r in hv.validation_reports.reports]}", flush=True)
print(f"weights {digest}", flush=True)
