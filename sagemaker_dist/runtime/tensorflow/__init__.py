"""The TensorFlow side of the runtime: every module that imports TensorFlow, Keras or Horovod, beside
PyTorch's (``runtime/torch/``), over the framework-neutral core (the other runtime modules).

- ``horovod_keras``, ``mwms_keras``: the modules scripts import (``from sagemaker_dist.runtime import
  horovod_keras``), for Horovod and for tf-mwms (MultiWorkerMirroredStrategy) jobs, one surface;
- ``keras/``: the parts behind them, one concern a file;
- ``data/``: the channels as tf.data datasets (``PipeModeDataset``, ``rank_dataset``, File-mode channels)
  and the compiled reader, a tf.data op built where it runs.

Importing this package loads nothing: TensorFlow and Horovod load when a dataset is made or ``setup()``
runs.
"""
