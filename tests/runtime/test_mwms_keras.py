"""``mwms_keras.setup`` refuses what only Horovod's helper does, before TensorFlow starts: a value the
strategy would silently ignore (1 is a record count, not "True") and an argument neither helper has."""

from __future__ import annotations

import pytest

from sagemaker_dist.runtime import mwms_keras


@pytest.mark.parametrize(
    "kwargs", [{"train_records": 1}, {"total_validation_records": 640}, {"warmup_epochs": 1}]
)
def test_horovod_only_values_are_refused_by_name(kwargs):
    with pytest.raises(mwms_keras.TrainingSetupError, match=next(iter(kwargs))):
        mwms_keras.setup(lambda lr: None, learning_rate=0.1, **kwargs)


def test_an_argument_neither_helper_has_is_a_type_error():
    with pytest.raises(TypeError, match="learning_rat"):
        mwms_keras.setup(lambda lr: None, learning_rat=0.1)
