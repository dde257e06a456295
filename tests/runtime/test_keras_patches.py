"""The private Keras methods the helpers replace are replaced only while a fit of theirs runs (real
TensorFlow and Keras 2 here; the Keras 3 replacements run in scripts/tf-latest-check.sh's demo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from sagemaker_dist.contract.layout import LAYOUT_HYPERPARAMETER, plan_layout
from sagemaker_dist.runtime.tensorflow.keras import patches
from sagemaker_dist.runtime.tensorflow.keras.agreement import AGREED, keras2_data_handler
from sagemaker_dist.runtime.tensorflow.keras.patches import FitWindow, Patch, keras_patched

pytestmark = pytest.mark.tensorflow


@pytest.fixture(autouse=True)
def nothing_left_patched():
    """Every test leaves Keras as it found it: no hold on the patches outlives it."""
    yield
    assert patches._depth == 0 and not patches._saved and not patches._filters


class Base:
    def f(self):
        return "base"


class Child(Base):
    def g(self):
        return "child"


def tagging(original):
    def replacement(self):
        return "patched " + original(self)

    return replacement


FAKE = [Patch(Child, "f", tagging), Patch(Child, "g", tagging)]


def test_the_outermost_exit_restores_the_originals_even_inherited_ones():
    original_g = Child.g
    with keras_patched(lambda: FAKE):
        assert (Child().f(), Child().g()) == ("patched base", "patched child")
        with keras_patched(lambda: FAKE):  # nested: nothing installed twice
            assert Child().f() == "patched base"
        assert Child().g() == "patched child"  # the inner exit leaves them in place
    assert "f" not in vars(Child) and Child.g is original_g and Child().f() == "base"


def test_keras_3s_advice_to_shuffle_after_the_reader_is_quiet_only_inside_the_window():
    import warnings

    text = (
        "`shuffle=True` was passed, but will be ignored since the data `x` was provided as a "
        "tf.data.Dataset. The Dataset is expected to already be shuffled (via `.shuffle(buffer_size)`)."
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with keras_patched(lambda: FAKE):
            warnings.warn(text, UserWarning, stacklevel=1)  # what Keras 3's fit says of a dataset
            warnings.warn("another warning", UserWarning, stacklevel=1)
        warnings.warn(text, UserWarning, stacklevel=1)  # after the fit: as Keras says it
    assert [str(w.message)[:30] for w in caught] == ["another warning", text[:30]]


def test_a_replacement_that_cannot_be_made_leaves_nothing_installed():
    broken = [Patch(Child, "g", tagging), Patch(Child, "missing", tagging)]
    original_g = Child.g
    with pytest.raises(AttributeError, match="missing"):
        with keras_patched(lambda: broken):
            pass
    assert Child.g is original_g and patches._depth == 0


def test_fit_windows_hold_until_their_fits_end_and_nest():
    handler = keras2_data_handler()
    original = handler.enumerate_epochs
    first, second = FitWindow(), FitWindow()
    first.handed_out()  # an agreed dataset handed out: Keras 3 builds from it before any callback
    first.handed_out()
    assert handler.enumerate_epochs is not original
    first.fit_begins()  # the fit takes the hold its dataset took
    second.fit_begins()
    first.fit_begins()  # a fit inside the fit
    first.fit_ends()
    first.fit_ends()
    assert handler.enumerate_epochs is not original  # the other helper's fit still runs
    second.fit_ends()
    assert handler.enumerate_epochs is original and not first.holding
    first.fit_ends()  # a train end without a begin (never happens) changes nothing
    first.handed_out()
    first.close()  # e.g. after a fit that raised
    assert handler.enumerate_epochs is original


def _agreed_batches(lengths):
    """Batches of one epoch per iteration, of ``lengths[i]`` batches in epoch i, marked ``AGREED``."""
    import tensorflow as tf

    epochs = iter(lengths)

    def records():
        for i in range(next(epochs) * 2):
            yield np.full(2, i, "float32"), np.ones(1, "float32")

    signature = (tf.TensorSpec((2,), tf.float32), tf.TensorSpec((1,), tf.float32))
    dataset = tf.data.Dataset.from_generator(records, output_signature=signature).batch(2)
    setattr(dataset, AGREED, True)
    return dataset


def _steps_per_epoch(dataset, callbacks, epochs=2):
    import tensorflow as tf

    steps: list[int] = []

    class Count(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            steps.append(0)

        def on_train_batch_end(self, batch, logs=None):
            steps[-1] += 1

    model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
    model.compile(tf.keras.optimizers.legacy.SGD(0.01), "mse")
    model.fit(dataset, epochs=epochs, verbose=0, callbacks=[*callbacks, Count()])
    return steps


def test_an_agreed_dataset_runs_epochs_of_any_length_inside_the_window_only():
    from sagemaker_dist.runtime.tensorflow.keras.callbacks import KerasPatchesWhileFitting

    window = FitWindow()
    window.handed_out()
    assert _steps_per_epoch(_agreed_batches([2, 4]), [KerasPatchesWhileFitting(window)]) == [2, 4]
    assert not window.holding
    # outside our fits Keras is itself: it holds the second epoch to the first one's 2 steps
    assert _steps_per_epoch(_agreed_batches([2, 4]), []) == [2, 2]


# In a fresh interpreter: an MPI-built Horovod, once initialised, stays up for the rest of the process.
HELPER_FIT = """
import json, sys
import numpy as np
import tensorflow as tf
from sagemaker_dist.runtime import horovod_keras
from sagemaker_dist.runtime.tensorflow.keras.agreement import keras2_data_handler

handler = keras2_data_handler()
original = handler.enumerate_epochs
hv = horovod_keras.setup(tf.keras.optimizers.legacy.SGD, learning_rate=0.1, root=sys.argv[1])
seen = [handler.enumerate_epochs is original]  # setup() replaces nothing


class Look(tf.keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        seen.append(handler.enumerate_epochs is original)


x = np.ones((8, 2), "float32")
model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
model.compile(hv.optimizer, "mse")
batches = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(4)
model.fit(hv.train_epoch(batches), epochs=2, **hv.fit_kwargs(callbacks=[Look()]))
seen.append(handler.enumerate_epochs is original)
print("SEEN " + json.dumps(seen))
"""


def test_the_helpers_fit_replaces_keras_methods_from_train_begin_to_train_end(tmp_path):
    pytest.importorskip("horovod.tensorflow")
    config = tmp_path / "input" / "config"
    config.mkdir(parents=True)
    layout = plan_layout(1, 1)
    (config / "inputdataconfig.json").write_text(
        json.dumps({n: {"TrainingInputMode": "Pipe"} for n in layout.channel_names})
    )
    (config / "hyperparameters.json").write_text(json.dumps({LAYOUT_HYPERPARAMETER: layout.to_json()}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_COMM_WORLD_", "HOROVOD_"))}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    proc = subprocess.run(
        [sys.executable, "-c", HELPER_FIT, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.split("SEEN ", 1)[1])
    assert seen == [True, False, False, True]  # original, replaced in both epochs, original again
