"""The Keras helpers behind the two modules scripts import (``tensorflow/horovod_keras.py`` and
``tensorflow/mwms_keras.py``), one concern a file:

- ``setup``: ``setup()`` and the ``HorovodKeras`` it returns, in the order Horovod needs;
- ``strategy``: the same surface on MultiWorkerMirroredStrategy (``surface``: what both share);
- ``arguments``: every check on ``setup()``'s arguments, all made before Horovod starts;
- ``preflight``: the Keras 2 and channel checks, also before the first collective;
- ``horovod_world``: an initialised Horovod's ranks, checked against the world mpirun started;
- ``gpu``: one GPU per local rank;
- ``optimizer``: the learning rate scaled by the number of workers;
- ``steps``: the steps per epoch all ranks agree on, and epochs cut to exactly that many batches;
- ``checkpoints``: TensorFlow checkpoints of model and optimizer in the core's checkpoint format;
- ``callbacks``: the Keras callbacks, as named classes (this file imports TensorFlow when loaded);
  ``tensorboard_callback``: the one that syncs TensorBoard's logs (the core's syncer returns it);
  ``stop_callback``: the Keras side of the core's stop agreement (``runtime/stop.py``);
- ``agreement``, ``keras3_strategy``: epochs that end by agreement, and Keras 3's mends under the strategy;
- ``patches``: the private Keras methods those replace, replaced only while a fit of ours runs;
- ``errors``: ``TrainingSetupError``.

Importing this package loads nothing: TensorFlow and Horovod load when ``setup()`` runs.
"""
