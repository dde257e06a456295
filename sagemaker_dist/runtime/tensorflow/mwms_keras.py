"""TensorFlow's MultiWorkerMirroredStrategy with the Horovod helper's surface: a script switches with one
line (``from sagemaker_dist.runtime import mwms_keras as distributed``), builds its model inside
``with hv.scope():`` and keeps the rest. For ``distribution='tf-mwms'`` jobs: any TensorFlow 2.15+,
Keras 2 or 3, no Horovod; the code is in ``keras/strategy.py`` beside it. Importing it
loads no TensorFlow: ``setup()`` does.
"""

from __future__ import annotations

from sagemaker_dist.runtime.tensorflow.keras.errors import TrainingSetupError
from sagemaker_dist.runtime.tensorflow.keras.strategy import StrategyKeras, setup

__all__ = ["TrainingSetupError", "StrategyKeras", "setup"]
