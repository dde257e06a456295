"""horovod_keras.setup() in one process (Horovod size 1, real TF): errors before any collective,
learning-rate scaling, exact epochs; two ranks are covered by tests/runtime/test_horovod_training.py."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import types

import numpy as np
import pytest

from sagemaker_dist.contract.layout import LAYOUT_HYPERPARAMETER, plan_layout
from sagemaker_dist.runtime import horovod_keras
from sagemaker_dist.runtime.ranks import RankChannelError
from sagemaker_dist.runtime.tensorflow.horovod_keras import TrainingSetupError, build_scaled_optimizer
from sagemaker_dist.runtime.tensorflow.keras import arguments, patches, preflight


@pytest.fixture(autouse=True)
def horovod_shut_down_afterwards():
    """setup() runs hvd.init() in this process; shut it down so later tests see no Horovod ranks. An
    MPI-built Horovod cannot start again once MPI is finalized: it stays up (one rank of one)."""
    yield
    hvd = sys.modules.get("horovod.tensorflow")
    if hvd is not None and hvd.is_initialized() and not hvd.mpi_built():
        hvd.shutdown()


def write_job(root, layout, channels=None):
    config = root / "input" / "config"
    config.mkdir(parents=True)
    names = layout.channel_names if channels is None else channels
    (config / "inputdataconfig.json").write_text(
        json.dumps({n: {"TrainingInputMode": "Pipe"} for n in names})
    )
    (config / "hyperparameters.json").write_text(json.dumps({LAYOUT_HYPERPARAMETER: layout.to_json()}))
    (config / "resourceconfig.json").write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))


def test_scaled_optimizer_from_instance_or_factory():
    import tensorflow as tf

    opt, base, scaled = build_scaled_optimizer(tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9), 4)
    assert (type(opt), base, scaled) == (tf.keras.optimizers.legacy.SGD, 0.1, pytest.approx(0.4))
    assert opt.get_config()["learning_rate"] == pytest.approx(0.4) and opt.get_config()["momentum"] == 0.9
    opt, base, scaled = build_scaled_optimizer(tf.keras.optimizers.legacy.Adam, 3, learning_rate=0.01)
    assert isinstance(opt, tf.keras.optimizers.legacy.Adam) and scaled == pytest.approx(0.03)
    with pytest.raises(TrainingSetupError, match="learning_rate="):
        build_scaled_optimizer(tf.keras.optimizers.legacy.Adam, 2)
    schedule = tf.keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9)
    with pytest.raises(TrainingSetupError, match="not a number"):
        build_scaled_optimizer(tf.keras.optimizers.legacy.SGD(schedule), 2)
    with pytest.raises(TrainingSetupError, match="neither"):
        build_scaled_optimizer("adam", 2)


def test_channel_mismatch_fails_before_horovod_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "3")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "3")
    write_job(tmp_path, plan_layout(1, 2))  # planned for 2 ranks, launched with 3
    with pytest.raises(RankChannelError, match=r"rank 2 .*'train_2'.*train_0, train_1"):
        horovod_keras.setup(lambda lr: None, learning_rate=0.1, root=tmp_path)


def test_channel_check_covers_file_mode_and_skips_jobs_without_layout(tmp_path, monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "SIZE", "LOCAL_SIZE"):
        monkeypatch.delenv(f"OMPI_COMM_WORLD_{name}", raising=False)
    horovod_keras.check_channels_before_collectives(tmp_path / "no-job")  # not launched by us: no check
    write_job(tmp_path / "file", plan_layout(1, 1, input_mode="File"))
    horovod_keras.check_channels_before_collectives(tmp_path / "file")  # File mode is fine
    write_job(tmp_path / "pipe", plan_layout(1, 1), channels=["validation_0"])
    with pytest.raises(RankChannelError, match="train_0"):
        horovod_keras.check_channels_before_collectives(tmp_path / "pipe")


def test_shared_pipe_validation_channel_is_refused_for_several_ranks_per_host(tmp_path, monkeypatch):
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("SIZE", "2"), ("LOCAL_SIZE", "2")):
        monkeypatch.setenv(f"OMPI_COMM_WORLD_{name}", value)
    write_job(tmp_path, plan_layout(1, 2, validation="single"))
    with pytest.raises(RankChannelError, match="one reader only"):
        horovod_keras.setup(
            lambda lr: None, learning_rate=0.1, validation_records=10, batch_size=2, root=tmp_path
        )


@pytest.fixture
def single_rank_job(tmp_path, monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "SIZE", "LOCAL_SIZE"):
        monkeypatch.delenv(f"OMPI_COMM_WORLD_{name}", raising=False)
    write_job(tmp_path, plan_layout(1, 1))
    return tmp_path


def test_shard_smaller_than_a_batch_is_named(single_rank_job):
    import tensorflow as tf

    with pytest.raises(
        TrainingSetupError, match=r"rank 0 has 3 train record\(s\), fewer than one batch of 8"
    ):
        horovod_keras.setup(
            tf.keras.optimizers.legacy.SGD,
            learning_rate=0.1,
            batch_size=8,
            train_records=3,
            root=single_rank_job,
        )


def test_setup_trains_exact_epochs_and_checkpoints(single_rank_job):
    import tensorflow as tf

    hv = horovod_keras.setup(
        tf.keras.optimizers.legacy.SGD,
        learning_rate=0.05,
        batch_size=4,
        train_records=18,
        warmup_epochs=1,
        root=single_rank_job,
    )
    assert (hv.rank, hv.size, hv.is_chief, hv.steps_per_epoch, hv.initial_epoch) == (0, 1, True, 4, 0)
    assert hv.learning_rate == pytest.approx(0.05) and hv.gpu is None  # CPU host: nothing pinned
    names = [type(c).__name__ for c in hv.callbacks]
    assert names.index("RankZeroCheckpoint") < names.index("BroadcastGlobalVariablesCallback")
    assert names.index("BroadcastGlobalVariablesCallback") < names.index("MetricAverageCallback")
    assert "LearningRateWarmupCallback" in names

    x = np.arange(40, dtype="float32").reshape(20, 2) / 40
    batches = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(4)  # 5 batches, 4 per epoch
    model = tf.keras.Sequential([tf.keras.Input(shape=(2,)), tf.keras.layers.Dense(1)])
    model.compile(hv.optimizer, "mse")
    history = model.fit(hv.train_epoch(batches), epochs=2, **hv.fit_kwargs())
    assert len(history.history["loss"]) == 2
    assert int(model.optimizer.iterations.numpy()) == 8  # exactly 4 steps per epoch
    assert sorted(p.name for p in (single_rank_job / "checkpoints").iterdir()) == [
        "epoch-00001",
        "epoch-00002",
    ]

    short = tf.data.Dataset.from_tensor_slices((x[:12], x[:12, :1])).batch(4)  # 3 batches, not 4
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"rank 0: its train shard ran out before the 4 "
        r"batches of 4 agreed per epoch \(records per rank given to setup\(\): \[18\]\)",
    ):
        model.fit(hv.train_epoch(short), epochs=1, verbose=0)
    assert len(list(hv.train_epoch(batches))) == 4  # a full shard passes the end check


def test_several_ranks_without_counts_agree_on_epoch_ends_instead():
    """total // size is no rank's shard (bytes are balanced, not records); no count at all is fine:
    the epoch then ends by agreement (the dataset is marked for it)."""
    hvd = pytest.importorskip("horovod.tensorflow")  # bench/compat_check.sh runs without Horovod
    import tensorflow as tf

    from sagemaker_dist.runtime.tensorflow.keras.agreement import AGREED, EpochReports

    with pytest.raises(
        TrainingSetupError, match=r"3, 3 and 2 files.*train_records= the records in this rank"
    ):
        arguments._per_rank(None, 512, 3, "train")
    assert arguments._per_rank(None, 512, 1, "train") == 512
    hv = horovod_keras.HorovodKeras(
        rank=1,
        local_rank=0,
        size=2,
        local_size=1,
        optimizer=None,
        learning_rate=1,
        hvd=hvd,
        validation_reports=EpochReports("validation", 1),
    )
    epoch = hv.validation_epoch(tf.data.Dataset.range(6).batch(2))
    assert getattr(epoch, AGREED) is True and epoch.element_spec.shape.as_list() == [None]
    assert hv.fit_window.holding  # Keras patched from the hand-out to the fit's end (none here)
    hv.fit_window.close()


def test_keras_3_is_refused_with_what_to_install():
    import tensorflow as tf

    assert preflight.tf_keras_version(tf).startswith("2.")  # TF 2.15's own Keras
    horovod_keras.check_keras_2(preflight.tf_keras_version(tf))
    horovod_keras.check_keras_2("2.15.0")
    with pytest.raises(TrainingSetupError, match=r"Keras 3.6.0; Horovod supports Keras 2 only.*tf_keras"):
        horovod_keras.check_keras_2("3.6.0")


def test_keras_releases_the_patches_were_not_written_for_are_named():
    for version in ("2.14.1", "2.15.0", "2.21.0", "3.7.0", "3.15.1"):
        patches.check_keras_release(version)
    for version, advice in (
        ("2.13.1", "TensorFlow 2.14 or 2.15"),
        ("3.6.0", "keras>=3.7,<3.16"),
        ("3.16.0", "keras>=3.7,<3.16"),
        ("2", "tf_keras 2.15 to 2.21"),
    ):
        with pytest.raises(TrainingSetupError, match=rf"Keras {re.escape(version)}, .*support Keras "
                           rf"2\.14-2\.21 and 3\.7-3\.15 only.*{re.escape(advice)}"):  # fmt: skip
            patches.check_keras_release(version)


def test_setup_refuses_a_keras_the_patches_were_not_written_for_before_horovod_starts(
    tmp_path, monkeypatch, horovod_tripwire
):
    import tensorflow as tf

    for name in ("RANK", "LOCAL_RANK", "SIZE", "LOCAL_SIZE"):
        monkeypatch.delenv(f"OMPI_COMM_WORLD_{name}", raising=False)
    keras = importlib.import_module(tf.keras.__name__.split(".", 1)[0])  # the package behind tf.keras
    monkeypatch.setattr(keras, "__version__", "2.13.1")
    with pytest.raises(
        TrainingSetupError, match=r"tf\.keras is Keras 2\.13\.1, .*2\.14-2\.21 and 3\.7-3\.15"
    ):
        horovod_keras.setup(lambda lr: None, learning_rate=0.1, root=tmp_path / "no-job")


def test_tensorboard_asked_for_but_not_installed_fails_in_setup_naming_the_package(
    tmp_path, monkeypatch, horovod_tripwire
):
    """Without the package Keras's TensorBoard callback would fail at the end of the first epoch."""
    for name in ("RANK", "LOCAL_RANK", "SIZE", "LOCAL_SIZE"):
        monkeypatch.delenv(f"OMPI_COMM_WORLD_{name}", raising=False)
    import tensorflow as tf

    matching = re.escape(".".join(tf.__version__.split(".")[:2]))  # TensorFlow's minor version
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # unimportable, as on the TF 2.21 wheel
    with pytest.raises(
        TrainingSetupError,
        match=r"tensorboard_dir='.*tb' needs the tensorboard package, which is not installed.*"
        rf"pip install 'tensorboard=={matching}\.\*', or drop tensorboard_dir",
    ):
        horovod_keras.setup(
            lambda lr: None, learning_rate=0.1, tensorboard_dir=tmp_path / "tb", root=tmp_path / "no-job"
        )


class _Tripwire(types.ModuleType):
    """Stands in for a Horovod module: asking whether it is initialised is fine (RankInfo.detect does);
    any other use means setup() got past its argument checks."""

    def is_initialized(self):
        return False

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AssertionError(f"setup() reached {self.__name__}.{name} before refusing its arguments")


@pytest.fixture
def horovod_tripwire(monkeypatch):
    """Horovod replaced by tripwires for the test: ``hvd.init()`` (or any collective) fails the test."""
    top = types.ModuleType("horovod")
    top.tensorflow = _Tripwire("horovod.tensorflow")
    top.tensorflow.keras = _Tripwire("horovod.tensorflow.keras")
    for name, module in (
        ("horovod", top),
        ("horovod.tensorflow", top.tensorflow),
        ("horovod.tensorflow.keras", top.tensorflow.keras),
    ):
        monkeypatch.setitem(sys.modules, name, module)


# (setup() keyword arguments over a valid base, what the error must say); all need no TensorFlow
BAD_ARGUMENTS = [
    ({"optimizer": "adam"}, "neither a Keras optimizer nor a callable"),
    ({"learning_rate": None}, r"optimizer factory needs learning_rate="),
    ({"learning_rate": -0.1}, r"learning_rate=-0\.1: give the single-worker learning rate"),
    ({"learning_rate": float("nan")}, r"learning_rate=nan"),
    ({"learning_rate": "0.1"}, r"learning_rate='0\.1'"),
    ({"batch_size": 0}, r"batch_size=0: give the per-rank batch size \(a whole number >= 1\)"),
    ({"batch_size": True}, r"batch_size=True"),
    ({"batch_size": 2.5}, r"batch_size=2\.5"),
    ({"train_records": -1, "batch_size": 4}, r"train_records=-1: give the train records in this rank's"),
    ({"validation_records": "10", "batch_size": 4}, r"validation_records='10'"),
    ({"train_records": 10}, r"train_records= needs batch_size="),
    ({"train_records": 10, "total_train_records": 10, "batch_size": 2}, "either train_records or total_"),
    ({"warmup_epochs": -1}, r"warmup_epochs=-1: give the epochs to warm up over"),
    ({"warmup_epochs": 2}, "warmup_epochs needs the steps per epoch: pass batch_size and train_records"),
    ({"checkpoints": "yes"}, r"checkpoints='yes': give True or False"),
    ({"keep_checkpoints": -1}, r"keep_checkpoints=-1"),
    ({"checkpoint_every": 0}, r"checkpoint_every=0: give a whole number of epochs >= 1"),
    ({"tensorboard_s3_uri": "s3://tb-bucket/run"}, "tensorboard_s3_uri needs tensorboard_dir"),
    ({"tensorboard_dir": "tb", "tensorboard_s3_uri": "tb-bucket/run"}, r"tensorboard_s3_uri='tb-bucket/run'"),
    ({"tensorboard_dir": 5}, r"tensorboard_dir=5: give a directory path"),
    ({"tensorboard_interval": 0}, r"tensorboard_interval=0: give seconds between uploads"),
    ({"root": 3}, r"root=3: give a directory path"),
    ({"pin_gpus": "no"}, r"pin_gpus='no': give True or False"),
    ({"check_channels": None}, r"check_channels=None: give True or False"),
]


def _setup_kwargs(root, overrides):
    kwargs = {"optimizer": lambda lr: None, "learning_rate": 0.1, "root": root, **overrides}
    return kwargs.pop("optimizer"), kwargs


@pytest.mark.parametrize("overrides, message", BAD_ARGUMENTS, ids=lambda v: str(v)[:40])
def test_each_bad_argument_is_named_before_horovod_starts(
    overrides, message, tmp_path, monkeypatch, horovod_tripwire
):
    for name in ("RANK", "LOCAL_RANK", "SIZE", "LOCAL_SIZE"):
        monkeypatch.delenv(f"OMPI_COMM_WORLD_{name}", raising=False)
    optimizer, kwargs = _setup_kwargs(tmp_path / "no-job", overrides)
    with pytest.raises(TrainingSetupError, match=message):
        horovod_keras.setup(optimizer, **kwargs)


def test_optimizer_whose_rate_is_a_schedule_fails_before_horovod_starts(tmp_path, horovod_tripwire):
    import tensorflow as tf

    schedule = tf.keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9)
    with pytest.raises(TrainingSetupError, match="not a number"):
        horovod_keras.setup(tf.keras.optimizers.legacy.SGD(schedule), root=tmp_path / "no-job")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"batch_size": 8, "total_train_records": 512}, r"3, 3 and 2 files.*train_records= the records"),
        (
            {"batch_size": 8, "train_records": 64, "total_validation_records": 30},
            r"total_validation_records=30 cannot give this rank's steps on 3 ranks",
        ),
    ],
)
def test_arguments_that_cannot_work_on_several_ranks_fail_before_horovod_starts(
    kwargs, message, tmp_path, monkeypatch, horovod_tripwire
):
    """The launcher's rank variables give the world size before hvd.init(), so these need no collective."""
    for name, value in (("RANK", "1"), ("LOCAL_RANK", "1"), ("SIZE", "3"), ("LOCAL_SIZE", "3")):
        monkeypatch.setenv(f"OMPI_COMM_WORLD_{name}", value)
    with pytest.raises(TrainingSetupError, match=message):
        horovod_keras.setup(lambda lr: None, learning_rate=0.1, root=tmp_path / "no-job", **kwargs)


def test_no_record_count_on_several_ranks_gets_past_the_checks(tmp_path, monkeypatch, horovod_tripwire):
    for name, value in (("RANK", "1"), ("LOCAL_RANK", "1"), ("SIZE", "3"), ("LOCAL_SIZE", "3")):
        monkeypatch.setenv(f"OMPI_COMM_WORLD_{name}", value)
    with pytest.raises(AssertionError, match="reached horovod.tensorflow.init"):
        horovod_keras.setup(lambda lr: None, learning_rate=0.1, batch_size=4, root=tmp_path / "no-job")


def test_bad_arguments_load_neither_tensorflow_nor_horovod(tmp_path):
    """In a fresh interpreter: importing horovod_keras and a refused setup() leave both unloaded."""
    code = (
        "import json, sys\n"
        "nan = float('nan')  # for the cases' repr\n"
        "from sagemaker_dist.runtime import horovod_keras\n"
        "from sagemaker_dist.runtime.tensorflow.keras import arguments, optimizer, preflight, steps, gpu\n"
        f"cases = {[o for o, _ in BAD_ARGUMENTS if 'optimizer' not in o]!r}\n"
        "refused = 0\n"
        "for overrides in cases:\n"
        f"    kwargs = {{'learning_rate': 0.1, 'root': {str(tmp_path / 'no-job')!r}, **overrides}}\n"
        "    try:\n"
        "        horovod_keras.setup(lambda lr: None, **kwargs)\n"
        "    except horovod_keras.TrainingSetupError:\n"
        "        refused += 1\n"
        "loaded = sorted(m for m in ('tensorflow', 'horovod', 'keras') if m in sys.modules)\n"
        "print(json.dumps([refused, len(cases), loaded]))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_COMM_WORLD_", "HOROVOD_"))}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    refused, cases, loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (refused, loaded) == (cases, []) and cases > 15


def test_callbacks_are_named_module_level_classes(single_rank_job):
    import tensorflow as tf

    from sagemaker_dist.runtime.tensorflow.keras import callbacks

    assert callbacks.BroadcastInitialWeights.__qualname__ == "BroadcastInitialWeights"
    hv = horovod_keras.setup(tf.keras.optimizers.legacy.SGD(0.1), root=single_rank_job)
    kinds = [type(c) for c in hv.callbacks]
    assert callbacks.BroadcastInitialWeights in kinds
    names = [k.__name__ for k in kinds]
    assert names.index("RankZeroCheckpoint") < names.index("BroadcastInitialWeights")
    assert names.index("BroadcastInitialWeights") < names.index("BroadcastGlobalVariablesCallback")
    assert (hv.steps_per_epoch, "LearningRateWarmupCallback" in names) == (None, False)
