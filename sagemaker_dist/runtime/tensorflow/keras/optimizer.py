"""The learning rate scaled by the number of workers: Horovod averages gradients over ``size`` ranks, so
each step sees ``size`` times the batch, and the usual rule multiplies the single-worker rate by ``size``.

Nothing here imports TensorFlow: ``setup()`` checks the optimizer before Horovod starts.
"""

from __future__ import annotations

import math
import numbers

from sagemaker_dist.runtime.tensorflow.keras.errors import TrainingSetupError


def _is_optimizer_instance(obj) -> bool:
    """A Keras optimizer object (not its class): it has a config to rebuild it from with a new rate."""
    return hasattr(obj, "get_config") and not isinstance(obj, type)


def _is_rate(value) -> bool:
    return (
        isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    )


def base_learning_rate(optimizer, learning_rate: float | None = None) -> float:
    """The single-worker rate: ``learning_rate`` if given, else the optimizer instance's own.

    Raises, before anything is built, for what cannot be scaled: an optimizer that is neither an
    instance nor a callable, a factory without ``learning_rate``, a rate that is not a number > 0
    (a schedule, for one).
    """
    if _is_optimizer_instance(optimizer):
        base = optimizer.get_config().get("learning_rate") if learning_rate is None else learning_rate
        if not (isinstance(base, numbers.Real) and not isinstance(base, bool)):
            raise TrainingSetupError(
                f"the optimizer's learning rate is {base!r}, not a number; pass learning_rate= (the "
                "single-worker rate) or an optimizer factory taking the rate"
            )
    elif callable(optimizer):
        if learning_rate is None:
            raise TrainingSetupError(
                "an optimizer factory needs learning_rate= (the single-worker rate); setup() passes "
                "learning_rate x number of workers to it"
            )
        base = learning_rate
    else:
        raise TrainingSetupError(
            f"optimizer={optimizer!r} is neither a Keras optimizer nor a callable returning one"
        )
    if not _is_rate(base):
        raise TrainingSetupError(
            f"learning rate {base!r}: give the single-worker rate as a finite number > 0 (learning_rate= "
            "or the optimizer's own)"
        )
    return float(base)


def build_scaled_optimizer(optimizer, size: int, learning_rate: float | None = None):
    """``(optimizer, base_lr, scaled_lr)`` with the rate multiplied by ``size``.

    ``optimizer`` is a Keras optimizer instance (its rate is the single-worker rate) or a callable
    taking the learning rate (a class such as ``tf.keras.optimizers.legacy.SGD``, or a lambda); a
    callable is called after GPU pinning, which new-style Keras optimizers need (they create variables).
    """
    base = base_learning_rate(optimizer, learning_rate)
    scaled = base * size
    if _is_optimizer_instance(optimizer):
        config = optimizer.get_config()
        return type(optimizer).from_config({**config, "learning_rate": scaled}), base, scaled
    return optimizer(scaled), base, scaled
