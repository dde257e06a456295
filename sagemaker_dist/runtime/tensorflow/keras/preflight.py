"""Checks that must pass before the first collective op: a rank that fails after it leaves the others
waiting ("Stalled ranks") instead of failing the job at once.

``check_channels_before_collectives`` needs neither TensorFlow nor Horovod, so a channel mismatch fails
in well under 10 s; ``check_tf_keras`` runs once TensorFlow is imported, before Horovod is.
"""

from __future__ import annotations

from sagemaker_dist.contract.distributions import distribution
from sagemaker_dist.contract.layout import HOROVOD, TF_MWMS
from sagemaker_dist.contract.rank_slots import RANK_VARIABLES, TF_CONFIG
from sagemaker_dist.runtime import environment
from sagemaker_dist.runtime.config import ContainerConfig
from sagemaker_dist.runtime.ranks import RankChannelError, RankInfo, check_rank_channels
from sagemaker_dist.runtime.tensorflow.keras.errors import TrainingSetupError
from sagemaker_dist.runtime.tensorflow.keras.horovod_world import HorovodRankInfo
from sagemaker_dist.runtime.tensorflow.keras.patches import check_keras_release, tf_keras_version


def check_keras_2(keras_version: str) -> None:
    """Horovod 0.28 wraps Keras 2 optimizers only; TF >= 2.16 brings Keras 3 unless told otherwise."""
    major = keras_version.split(".", 1)[0]
    if major.isdigit() and int(major) >= 3:
        raise TrainingSetupError(
            f"tf.keras is Keras {keras_version}; Horovod supports Keras 2 only. On TensorFlow 2.16 or "
            "newer, pip install tf_keras (the same minor version as TensorFlow) and set "
            "TF_USE_LEGACY_KERAS=1 before TensorFlow is imported"
        )


def check_tf_keras(tf) -> None:
    """Refuse Keras 3 behind ``tf.keras`` (the imported TensorFlow module ``tf``) before Horovod loads,
    and a Keras 2 release the helpers' Keras patches were not written for."""
    version = tf_keras_version(tf)
    check_keras_2(version)
    check_keras_release(version)


def check_tf_keras_release(tf) -> None:
    """Refuse a Keras behind ``tf.keras`` the helpers' Keras patches were not written for (loads Keras,
    starts no TensorFlow runtime: the strategy can still be created after it)."""
    check_keras_release(tf_keras_version(tf))


def check_channels_before_collectives(root=None, *, validation: bool = False) -> None:
    """Fail fast, before any collective op, if this rank has no channel of its own (rank/channel
    mismatch, missing channel) or would share a Pipe FIFO with another rank of its host (e.g. one
    validation channel for several ranks: horovod#600). Skipped for jobs without a sagemaker-dist
    layout."""
    config = ContainerConfig.load(root)
    if config.layout is None:
        return
    info = HorovodRankInfo.detect()
    modes = ("Pipe", "File")  # File mode: every rank reads the channel's files itself
    check_rank_channels(config, info, role="train", input_modes=modes)
    if validation:
        check_rank_channels(config, info, role="validation", input_modes=modes)


def launched_world() -> RankInfo | None:
    """This process's rank and world size as the launcher set them (Horovod not started yet), so
    checks that depend on the number of ranks can run before ``hvd.init()``; None if they are unclear."""
    try:
        return HorovodRankInfo.detect()
    except RankChannelError:  # odd launcher variables: Horovod's own numbers decide after init
        return None


def _setup_call(name: str) -> str:
    """What a script of distribution ``name`` calls to set up (its registry entry's helper)."""
    entry = distribution(name)
    return f"{entry.keras_helper}.setup()" if entry.keras_helper else f"setup_ddp() ({entry.title})"


def check_job_distribution(expected: str, root=None) -> None:
    """The script's helper must match how the job was launched: the layout's distribution where the job
    has one, else the launcher's variables (mpirun/horovodrun ranks, or the toolkit's ``TF_CONFIG``).
    Caught here, before any collective; otherwise each process trains alone or waits for ever."""
    layout = ContainerConfig.load(root).layout
    env = environment.environ()
    mpi_launched = any(names[0] in env for names in RANK_VARIABLES)
    if layout is not None:
        launched, how = layout.distribution, "planned"
    elif mpi_launched:
        launched, how = HOROVOD, "launched by mpirun or horovodrun"
    elif env.get(TF_CONFIG):
        launched, how = TF_MWMS, "launched with TF_CONFIG"
    else:
        return  # one process on its own: either helper runs it
    if launched != expected:
        raise TrainingSetupError(
            f"the script calls {_setup_call(expected)}, but this job was {how} for distribution "
            f"{launched!r}: call {_setup_call(launched)} instead, or launch with distribution={expected!r}"
        )
