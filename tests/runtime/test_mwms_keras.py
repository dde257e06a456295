"""``mwms_keras.setup`` refuses what only Horovod's helper does, before TensorFlow starts: a value the
strategy would silently ignore (1 is a record count, not "True") and an argument neither helper has."""

from __future__ import annotations

import importlib
import re
import sys

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


def test_a_keras_the_patches_were_not_written_for_is_refused_before_the_strategy_starts(
    tmp_path, monkeypatch
):
    import tensorflow as tf

    for name in ("TF_CONFIG", "OMPI_COMM_WORLD_RANK", "HOROVOD_RANK"):
        monkeypatch.delenv(name, raising=False)
    keras = importlib.import_module(tf.keras.__name__.split(".", 1)[0])  # the package behind tf.keras
    monkeypatch.setattr(keras, "__version__", "3.16.0")

    def no_strategy(*args, **kwargs):
        raise AssertionError("setup() started the strategy before refusing the Keras release")

    monkeypatch.setattr(tf.distribute, "MultiWorkerMirroredStrategy", no_strategy)
    with pytest.raises(
        mwms_keras.TrainingSetupError,
        match=r"Keras 3\.16\.0, .*2\.14-2\.21 and 3\.7-3\.15 only.*pip install 'keras>=3\.7,<3\.16'",
    ):
        mwms_keras.setup(lambda lr: None, learning_rate=0.1, root=tmp_path / "no-job")


def test_tensorboard_asked_for_but_not_installed_fails_in_setup_not_after_the_first_epoch(
    tmp_path, monkeypatch
):
    for name in ("TF_CONFIG", "OMPI_COMM_WORLD_RANK", "HOROVOD_RANK"):
        monkeypatch.delenv(name, raising=False)
    import tensorflow as tf

    matching = re.escape(".".join(tf.__version__.split(".")[:2]))  # TensorFlow's minor version
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # unimportable, as on the TF 2.21 wheel
    with pytest.raises(
        mwms_keras.TrainingSetupError,
        match=rf"needs the tensorboard package, which is not installed.*'tensorboard=={matching}\.\*'",
    ):
        mwms_keras.setup(
            lambda lr: None, learning_rate=0.1, tensorboard_dir=tmp_path / "tb", root=tmp_path / "no-job"
        )
