"""Test entry script for both distributions: train a tiny model on this worker's own channel with the
helper named by --helper (mwms_keras or horovod_keras), no record counts, and print the steps each
epoch took on this worker."""

import argparse

import tensorflow as tf

from sagemaker_dist.runtime import horovod_keras, mwms_keras, rank_dataset

parser = argparse.ArgumentParser()
parser.add_argument("--helper", default="mwms")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch_size", type=int, default=8)
args, _ = parser.parse_known_args()
helper = mwms_keras if args.helper == "mwms" else horovod_keras
optimizer = tf.keras.optimizers.SGD if args.helper == "mwms" else tf.keras.optimizers.legacy.SGD
hv = helper.setup(optimizer, learning_rate=0.01, batch_size=args.batch_size)


def parse(serialized):
    features = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}
    parsed = tf.io.parse_single_example(serialized, features)
    image = tf.cast(tf.io.decode_raw(parsed["image"], tf.uint8)[:8], tf.float32) / 255.0
    return tf.reshape(image, [8]), parsed["label"]


class StepCounter(tf.keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1

    def on_epoch_end(self, epoch, logs=None):
        print(f"STEPS worker={hv.rank} epoch={epoch} steps={self.steps}", flush=True)


with hv.scope():
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(10)])
    model.compile(hv.optimizer, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
batches = rank_dataset("train", "TFRecord").map(parse).batch(args.batch_size, drop_remainder=True)
model.fit(hv.train_epoch(batches), epochs=args.epochs, **hv.fit_kwargs(callbacks=[StepCounter()]))
print(f"DONE worker={hv.rank} initial_epoch={hv.initial_epoch}", flush=True)
