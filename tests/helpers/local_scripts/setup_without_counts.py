"""Test entry script: horovod_keras.setup() on several ranks without this rank's record count."""

import tensorflow as tf

from sagemaker_dist.runtime import horovod_keras

horovod_keras.setup(tf.keras.optimizers.legacy.SGD, learning_rate=0.1, batch_size=4)
print("setup returned without a record count", flush=True)
