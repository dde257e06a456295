"""Training job that tests/runtime/test_horovod_training.py runs under ``horovodrun -np 2 --gloo``.

The example's model and input pipeline on the runtime helpers, plus evidence for the test: the record
ids each rank read, its weights at train begin and at the end, its history and its process id.
Usage: horovod_job.py OUT_DIR EPOCHS BATCH TRAIN_RECORDS VALIDATION_RECORDS TENSORBOARD_S3_URI
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

from sagemaker_dist.local.demo import DEMO_JOB_DIR
from sagemaker_dist.runtime import horovod_keras

REPO = Path(__file__).resolve().parents[2]


def load_example():
    spec = importlib.util.spec_from_file_location("train_cifar10", DEMO_JOB_DIR / "train_cifar10.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    out = Path(sys.argv[1])
    epochs, batch, train_records, validation_records = (int(a) for a in sys.argv[2:6])
    s3_uri = sys.argv[6]
    example = load_example()

    hv = horovod_keras.setup(
        lambda lr: tf.keras.optimizers.legacy.SGD(lr, momentum=0.9),
        learning_rate=0.01,
        batch_size=batch,
        train_records=train_records,
        validation_records=validation_records,
        warmup_epochs=3,
        tensorboard_dir=out / "tb",
        tensorboard_s3_uri=s3_uri,
        tensorboard_interval=0.5,
    )
    seen: dict[str, list[int]] = {"train": [], "validation": []}
    features = {**example.FEATURES, "id": tf.io.FixedLenFeature([], tf.int64)}

    def tracking(role):
        def note(record_id):
            seen[role].append(int(record_id.numpy()))
            return record_id

        def parse(serialized):
            record_id = tf.io.parse_single_example(serialized, features)["id"]
            record_id = tf.py_function(note, [record_id], tf.int64)
            image, label = example.parse_record(serialized)
            with tf.control_dependencies([record_id]):
                return tf.identity(image), label

        return parse

    start_weights = {}

    class KeepStartWeights(tf.keras.callbacks.Callback):
        def on_train_begin(self, logs=None):  # after the setup callbacks: restored and broadcast
            start_weights.update({f"w{i}": w for i, w in enumerate(self.model.get_weights())})

    model = example.build_model()
    model.compile(
        optimizer=hv.optimizer,
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    history = model.fit(
        hv.train_epoch(example.batches("train", batch, tracking("train"))),
        validation_data=hv.validation_epoch(example.batches("validation", batch, tracking("validation"))),
        epochs=epochs,
        **hv.fit_kwargs(callbacks=[KeepStartWeights()]),
    )
    np.savez(out / f"start-rank{hv.rank}.npz", **start_weights)
    np.savez(out / f"final-rank{hv.rank}.npz", **{f"w{i}": w for i, w in enumerate(model.get_weights())})
    report = {
        "rank": hv.rank,
        "size": hv.size,
        "pid": os.getpid(),
        "initial_epoch": hv.initial_epoch,
        "steps_per_epoch": hv.steps_per_epoch,
        "validation_steps": hv.validation_steps,
        "learning_rate": hv.learning_rate,
        "seen": seen,
        "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
        "syncer_failures": hv.tensorboard_syncer.failures if hv.tensorboard_syncer else None,
        # epochs this rank's checkpoint callback wrote (rank 0 only, if the rank check works)
        "checkpoint_saves": [e for c in hv.callbacks for e in getattr(c, "saved", [])],
    }
    (out / f"rank{hv.rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
