"""The private Keras methods the helpers replace, replaced only while a fit of theirs runs.

Keras holds every epoch to the first one's step count (``agreement.py`` lifts that for the datasets the
helpers mark ``AGREED``), and Keras 3 under MultiWorkerMirroredStrategy builds a model by reading a
batch and mean-reduces scalar metrics along an axis they lack (``keras3_strategy.py``). Each fix
replaces a private Keras method; ``keras_patched()`` puts the replacements in place and the originals
back when its outermost entry leaves, so the process's other fits, and other libraries, see Keras as
it is. ``FitWindow`` is how a helper holds it: from handing out an agreed dataset (Keras 3 reads one to
build the model before any callback runs) or a fit's train begin, to the end of that fit.

The replacements were written against, and read against the source of, the Keras releases in
``KERAS_RELEASES``; ``check_keras_release`` (run by both ``setup()``s) refuses any other, since a
private method that changed would make them misbehave rather than fail.
"""

from __future__ import annotations

import importlib
import re
import threading
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sagemaker_dist.runtime.tensorflow.keras.errors import TrainingSetupError

# Keras major version: the first and last minor whose private methods the replacements were checked
# against. Keras 2: DataHandler.enumerate_epochs, the same from tf.keras 2.14 through tf_keras 2.21.
# Keras 3: EpochIterator._enumerate_iterator (from 3.7), TensorFlowTrainer._maybe_symbolic_build and
# trainer.reduce_per_replica, the same through 3.15 (TF 2.21's). Run on 2.15 and 3.15 (tf-latest-check).
KERAS_RELEASES = {2: (14, 21), 3: (7, 15)}
_INSTALL = {
    2: "use TensorFlow 2.14 or 2.15 (each brings its Keras 2), or tf_keras 2.15 to 2.21 with "
    "TF_USE_LEGACY_KERAS=1",
    3: "pip install 'keras>=3.7,<3.16'",
}

_ABSENT = object()  # the owner had no attribute of its own (it was inherited): delete the replacement

# Keras 3's fit warns on every rank, for any tf.data input, that its default shuffle=True is ignored and
# the dataset should be shuffled "via .shuffle(buffer_size)": advice that would break the exact resume
# (the readers shuffle; reader_resume.SHUFFLED_AFTER_THE_READER). Quiet while a helper's fit runs.
SHUFFLE_IGNORED = (
    r"`shuffle=True` was passed, but will be ignored since the data `x` was provided as a tf\.data"
)


@dataclass(frozen=True)
class Patch:
    """Replace ``owner.name`` (a class or module attribute) with ``make(original)``."""

    owner: Any
    name: str
    make: Callable[[Any], Any]


def keras_patches() -> list[Patch]:
    """The replacements for the Keras behind ``tf.keras`` (imports TensorFlow)."""
    from sagemaker_dist.runtime.tensorflow.keras import agreement, keras3_strategy

    if keras_major() >= 3:
        from keras.src.backend.tensorflow import trainer
        from keras.src.trainers.epoch_iterator import EpochIterator

        return [
            Patch(EpochIterator, "_enumerate_iterator", agreement.keras3_epochs_of_any_length),
            Patch(trainer.TensorFlowTrainer, "_maybe_symbolic_build", keras3_strategy.build_from_spec),
            Patch(trainer, "reduce_per_replica", keras3_strategy.scalar_means),
        ]
    return [Patch(agreement.keras2_data_handler(), "enumerate_epochs", agreement.keras2_epochs_of_any_length)]


def tf_keras_version(tf) -> str:
    """The version of the package behind ``tf.keras``: keras (2 or 3) or tf_keras (Keras 2)."""
    package = importlib.import_module(tf.keras.__name__.split(".", 1)[0])
    return str(getattr(package, "__version__", "2"))


def keras_major() -> int:
    """The major version behind ``tf.keras`` (imports TensorFlow)."""
    import tensorflow as tf

    major = tf_keras_version(tf).split(".", 1)[0]
    return int(major) if major.isdigit() else 2


def supported_keras() -> str:
    """The releases the replacements were written for, as a person reads them: "2.14-2.21 and 3.7-3.15"."""
    return " and ".join(f"{major}.{first}-{major}.{last}" for major, (first, last) in KERAS_RELEASES.items())


def check_keras_release(version: str) -> None:
    """Refuse a Keras whose private methods the replacements were not written for, naming it, the
    supported releases and what to install."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found:
        major, minor = int(found.group(1)), int(found.group(2))
        first, last = KERAS_RELEASES.get(major, (1, 0))
        if first <= minor <= last:
            return
        advice = _INSTALL[min(max(major, 2), 3)]
    else:
        advice = f"{_INSTALL[2]}; or {_INSTALL[3]}"
    raise TrainingSetupError(
        f"tf.keras is Keras {version}, and sagemaker-dist's helpers support Keras {supported_keras()} "
        "only: during fit they replace private Keras methods (runtime/tensorflow/keras/patches.py) that "
        f"other releases may have changed, which would train wrongly rather than fail. To run: {advice}"
    )


_lock = threading.Lock()
_depth = 0
_saved: list[tuple[Any, str, Any]] = []  # (owner, name, what the owner itself held), in install order
_filters: list = []  # the warning filters installed with them


def _install(patches: list[Patch]) -> None:
    try:
        for patch in patches:
            original = getattr(patch.owner, patch.name)
            _saved.append((patch.owner, patch.name, vars(patch.owner).get(patch.name, _ABSENT)))
            setattr(patch.owner, patch.name, patch.make(original))
        warnings.filterwarnings("ignore", message=SHUFFLE_IGNORED, category=UserWarning)
        _filters.append(warnings.filters[0])
    except BaseException:
        _restore()
        raise


def _restore() -> None:
    while _filters:
        entry = _filters.pop()
        if entry in warnings.filters:  # not where a catch_warnings() put its own list meanwhile
            warnings.filters.remove(entry)
    while _saved:
        owner, name, before = _saved.pop()
        if before is _ABSENT:
            delattr(owner, name)
        else:
            setattr(owner, name, before)


@contextmanager
def keras_patched(patches: Callable[[], list[Patch]] = keras_patches):
    """The replacements in place inside, the originals back after the outermost exit (nesting-safe,
    thread-safe: every entry counts, the first installs, the last restores)."""
    global _depth
    with _lock:
        if _depth == 0:
            _install(patches())
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _restore()


class FitWindow:
    """One helper's hold on ``keras_patched()``: taken when it hands ``fit`` an agreed dataset or a fit
    with its callbacks begins, released when that fit ends. A fit that raises never reaches its train
    end, so the hold then lasts until the next fit of this helper ends, or ``close()``."""

    def __init__(self):
        self._handed_out = None  # the hold taken by handing out a dataset, for the fit that takes it
        self._fits: list = []  # one hold per fit begun and not ended (a fit inside a fit nests)

    def handed_out(self) -> None:
        if self._handed_out is None:
            self._handed_out = _hold()

    def fit_begins(self) -> None:
        self._fits.append(self._handed_out or _hold())
        self._handed_out = None

    def fit_ends(self) -> None:
        if self._fits:
            self._fits.pop().__exit__(None, None, None)

    @property
    def holding(self) -> bool:
        return self._handed_out is not None or bool(self._fits)

    def close(self) -> None:
        """Release every hold (after a fit that raised, say)."""
        while self._fits:
            self.fit_ends()
        if self._handed_out is not None:
            self._handed_out, held = None, self._handed_out
            held.__exit__(None, None, None)


def _hold():
    held = keras_patched()
    held.__enter__()
    return held
