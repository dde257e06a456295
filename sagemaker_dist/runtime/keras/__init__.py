"""The parts behind ``sagemaker_dist.runtime.horovod_keras`` (scripts import that), one concern a file.

- ``setup``: ``setup()`` and the ``HorovodKeras`` it returns, in the order Horovod needs;
- ``arguments``: every check on ``setup()``'s arguments, all made before Horovod starts;
- ``preflight``: the Keras 2 and channel checks, also before the first collective;
- ``gpu``: one GPU per local rank;
- ``optimizer``: the learning rate scaled by the number of workers;
- ``steps``: the steps per epoch all ranks agree on, and epochs cut to exactly that many batches;
- ``callbacks``: the Keras callbacks, as named classes (this file imports TensorFlow when loaded);
- ``agreement``, ``keras3_strategy``: epochs that end by agreement, and Keras 3's mends under the strategy;
- ``patches``: the private Keras methods those replace, replaced only while a fit of ours runs;
- ``errors``: ``TrainingSetupError``.

Importing this package loads nothing: TensorFlow and Horovod load when ``setup()`` runs.
"""
