"""Train a small CNN on CIFAR-10-shaped TFRecords, each worker reading its own Pipe-mode channel: Horovod
ranks, or TensorFlow's MultiWorkerMirroredStrategy for ``distribution='tf-mwms'`` jobs (the helper is
chosen from the job's layout; a script of your own imports the one it uses).

Records are ``tf.train.Example`` with ``image`` (32x32x3 uint8, raw bytes) and ``label`` (int64, 0-9).
The sagemaker-training toolkit runs this as ``sagemaker_program`` under mpirun and passes the user
hyperparameters as ``--name value`` (``sagemaker-dist local`` does the same):

    --epochs 2 --batch-size 32 --learning-rate 0.001 [--tensorboard-s3-uri s3://bucket/tb/job]
    [--tensorboard-interval 30] [--reader-shuffle-seed 0] [--reader-shuffle-records 4096]

The train reader shuffles each epoch's records in a seeded window (``--reader-shuffle-seed -1`` reads
the stream in order).

No record counts: shards are balanced by bytes, so their record counts differ, and the ranks agree at
every step whether each still has a batch; every epoch ends on every rank when the first runs out
(``horovod_keras``). The job validates when it has a validation channel. The model goes to
``$SM_MODEL_DIR`` (else ``<root>/model``) from rank 0; checkpoints to ``<root>/checkpoints``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

import tensorflow as tf

from sagemaker_dist.contract.distributions import distribution
from sagemaker_dist.contract.paths import opt_ml_root
from sagemaker_dist.runtime import ShuffleWindow, mwms_keras, rank_dataset
from sagemaker_dist.runtime.config import ContainerConfig

IMAGE_SHAPE = (32, 32, 3)
NUM_CLASSES = 10
FEATURES = {
    "image": tf.io.FixedLenFeature([], tf.string),
    "label": tf.io.FixedLenFeature([], tf.int64),
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])

    def arg(name, **kw):  # the toolkit passes hyperparameter names as written: accept - and _
        p.add_argument(f"--{name}", f"--{name.replace('-', '_')}", dest=name.replace("-", "_"), **kw)

    arg("epochs", type=int, default=2)
    arg("batch-size", type=int, default=32, help="per rank")
    arg("learning-rate", type=float, default=0.001, help="single-worker rate; scaled by the rank count")
    arg("warmup-epochs", type=float, default=0)
    arg("tensorboard-s3-uri", default=None)
    arg("tensorboard-interval", type=float, default=30.0)
    arg("model-dir", default=None, help="local directory; default $SM_MODEL_DIR, else <root>/model")
    arg("reader-shuffle-seed", type=int, default=0, help="the train reader's shuffle; -1 reads in order")
    arg("reader-shuffle-records", type=int, default=None, help="records in a shuffle window (default 4096)")
    args, unknown = p.parse_known_args(argv)
    if args.model_dir and args.model_dir.startswith("s3://"):  # the TF toolkit's legacy --model_dir
        unknown += ["--model_dir", args.model_dir]
        args.model_dir = None
    if unknown:
        logging.getLogger(__name__).info("ignoring arguments %s", unknown)
    return args


def parse_record(serialized):
    """One serialized Example -> (float image in [0, 1], int label)."""
    parsed = tf.io.parse_single_example(serialized, FEATURES)
    image = tf.reshape(tf.io.decode_raw(parsed["image"], tf.uint8), IMAGE_SHAPE)
    return tf.cast(image, tf.float32) / 255.0, parsed["label"]


def batches(role: str, batch_size: int, parse=parse_record, shuffle=None) -> tf.data.Dataset:
    """This rank's own channel for ``role`` as batches; each new iterator (each epoch) reads the next FIFO.
    ``shuffle``: the reader's shuffle window, a ``ShuffleWindow`` (None: the stream's order)."""
    ds = rank_dataset(role, "TFRecord", shuffle=shuffle).map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def build_model() -> tf.keras.Model:
    """A small ResNet-ish CNN: fast on CPU with tiny data, still a real conv net."""
    inputs = tf.keras.Input(shape=IMAGE_SHAPE)
    x = tf.keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
    shortcut = x
    x = tf.keras.layers.Conv2D(16, 3, padding="same", activation="relu")(x)
    x = tf.keras.layers.Conv2D(16, 3, padding="same")(x)
    x = tf.keras.layers.ReLU()(tf.keras.layers.Add()([x, shortcut]))
    x = tf.keras.layers.MaxPooling2D()(x)
    x = tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    x = tf.keras.layers.GlobalAveragePooling2D()(x)
    outputs = tf.keras.layers.Dense(NUM_CLASSES)(x)
    return tf.keras.Model(inputs, outputs, name="cifar10_small_resnet")


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tf.get_logger().handlers.clear()  # TensorFlow's own handler would print each of its lines twice
    args = parse_args(argv)
    layout = ContainerConfig.load().layout
    validate = layout is not None and layout.has_role("validation")
    log_dir = os.path.join(os.environ.get("SM_OUTPUT_DATA_DIR") or opt_ml_root() / "output" / "data", "tb")
    # the helper of the job's distribution (horovod_keras or mwms_keras): the one line a script switches
    distributed = importlib.import_module(distribution(layout.distribution if layout else None).keras_helper)
    strategy_job = distributed is mwms_keras
    hv = distributed.setup(
        tf.keras.optimizers.Adam if strategy_job else tf.keras.optimizers.legacy.Adam,
        learning_rate=args.learning_rate,
        batch_size=args.batch_size,
        warmup_epochs=args.warmup_epochs,
        tensorboard_dir=log_dir if args.tensorboard_s3_uri else None,
        tensorboard_s3_uri=args.tensorboard_s3_uri,
        tensorboard_interval=args.tensorboard_interval,
    )
    # the train reader's seeded window: shuffled each epoch, and a resume inside one trains each record once
    reader_shuffle = None
    if args.reader_shuffle_seed >= 0:
        window = {"records": args.reader_shuffle_records} if args.reader_shuffle_records else {}
        reader_shuffle = ShuffleWindow(args.reader_shuffle_seed, **window)
    with hv.scope():
        model = build_model()
        model.compile(
            optimizer=hv.optimizer,
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    model.fit(
        hv.train_epoch(batches("train", args.batch_size, shuffle=reader_shuffle)),
        validation_data=hv.validation_epoch(batches("validation", args.batch_size)) if validate else None,
        epochs=args.epochs,
        **hv.fit_kwargs(),
    )
    model_dir = args.model_dir or os.environ.get("SM_MODEL_DIR") or str(opt_ml_root() / "model")
    export = os.path.join(model_dir, "1")  # TensorFlow Serving wants a numbered version directory
    if hv.save_model(model, export):  # the chief's copy; every worker takes part under the strategy
        print(f"model saved to {export}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
