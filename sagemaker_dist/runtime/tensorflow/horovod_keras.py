"""The usual Horovod + Keras script changes in one call, arranged so no rank can wait forever on another.

``setup()`` checks every argument, then runs ``hvd.init``, pins one GPU per local rank (memory growth
on), scales the learning rate by the number of workers (optionally warmed up over the first epochs),
wraps the optimizer in ``hvd.DistributedOptimizer``, agrees on steps per epoch from every rank's shard
size (the smallest shard decides, so all ranks run the same number of steps and the same collectives),
finds the resume epoch from rank 0's newest checkpoint, and returns the callbacks in the order that
matters: restore and save checkpoints (rank 0), broadcast rank 0's state, average metrics (train and
validation, horovod#600), warm-up, then rank 0's TensorBoard logging and its sync to S3.

This is the module scripts import (``from sagemaker_dist.runtime import horovod_keras``); the code is
in ``keras/`` beside it, one concern a file. Importing it loads neither TensorFlow nor
Horovod: ``setup()`` does.
"""

from __future__ import annotations

from sagemaker_dist.runtime.tensorflow.keras.errors import TrainingSetupError
from sagemaker_dist.runtime.tensorflow.keras.gpu import pin_gpu
from sagemaker_dist.runtime.tensorflow.keras.optimizer import build_scaled_optimizer
from sagemaker_dist.runtime.tensorflow.keras.preflight import check_channels_before_collectives, check_keras_2
from sagemaker_dist.runtime.tensorflow.keras.setup import HorovodKeras, setup

__all__ = [
    "HorovodKeras",
    "TrainingSetupError",
    "build_scaled_optimizer",
    "check_channels_before_collectives",
    "check_keras_2",
    "pin_gpu",
    "setup",
]
