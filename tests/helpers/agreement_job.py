"""Run under ``horovodrun -np 2``: epochs of different lengths on each rank and from epoch to epoch,
with no record counts. Rank 0 has 6, then 3, then 8 batches; rank 1 has 7 every epoch. Prints the
agreed steps per epoch and a digest of the final weights, one line per rank."""

import hashlib
import json

import numpy as np
import tensorflow as tf

from sagemaker_dist.runtime import horovod_keras

hv = horovod_keras.setup(
    tf.keras.optimizers.legacy.SGD, learning_rate=0.01, batch_size=4, checkpoints=False, check_channels=False
)
epoch = {"n": 0}


def records():
    epoch["n"] += 1
    batches = {1: 6, 2: 3, 3: 8}[epoch["n"]] if hv.rank == 0 else 7
    for i in range(batches * 4):
        yield np.full(3, i + hv.rank, "float32"), np.ones(1, "float32")


signature = (tf.TensorSpec((3,), tf.float32), tf.TensorSpec((1,), tf.float32))
data = tf.data.Dataset.from_generator(records, output_signature=signature).batch(4)
tf.keras.utils.set_random_seed(1)
model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
model.compile(hv.optimizer, loss="mse")
model.fit(hv.train_epoch(data), epochs=3, **hv.fit_kwargs())
digest = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights())).hexdigest()[:16]
reports = hv.train_reports.reports
print(
    "RESULT "
    + json.dumps(
        {
            "rank": hv.rank,
            "steps": [r.steps for r in reports],
            "weights": digest,
            "left": [list(r.records_left) for r in reports],
        }
    ),
    flush=True,
)
