"""Rank detection and the fail-fast rank/channel start-up check (in-process and as real processes)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest
from helpers.runtime_helpers import write_opt_ml

from sagemaker_dist.contract.layout import plan_layout
from sagemaker_dist.runtime.config import ROOT_ENV, ContainerConfig
from sagemaker_dist.runtime.ranks import RankChannelError, RankInfo, check_rank_channels
from sagemaker_dist.runtime.tensorflow.keras.horovod_world import HorovodWorldError, check_horovod_world

OMPI = (
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
)
HVD = ("HOROVOD_RANK", "HOROVOD_LOCAL_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_SIZE")


@pytest.fixture(autouse=True)
def horovod_not_initialised_here(monkeypatch):
    """Another test in this process may have run hvd.init(); detection must then not see it here."""
    for name in ("horovod.tensorflow", "horovod.tensorflow.keras", "horovod.keras"):
        monkeypatch.delitem(sys.modules, name, raising=False)


def env_of(names, values) -> dict[str, str]:
    return {n: str(v) for n, v in zip(names, values)}


def test_detect_prefers_open_mpi_then_horovod_variables_then_one_process():
    assert RankInfo.detect({}) == RankInfo(0, 0, 1, 1, "default")
    assert RankInfo.detect(env_of(HVD, (3, 1, 4, 2))) == RankInfo(3, 1, 4, 2, "HOROVOD_*")
    both = {**env_of(HVD, (0, 0, 2, 2)), **env_of(OMPI, (5, 1, 8, 4))}
    info = RankInfo.detect(both)
    assert (info.rank, info.local_rank, info.size, info.local_size) == (5, 1, 8, 4)
    assert info.source == "OMPI_COMM_WORLD_*"


def test_detect_rejects_partial_or_inconsistent_variables():
    with pytest.raises(
        RankChannelError, match="OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_LOCAL_RANK is not"
    ):
        RankInfo.detect({"OMPI_COMM_WORLD_RANK": "0"})
    with pytest.raises(RankChannelError, match="not whole numbers"):
        RankInfo.detect(env_of(HVD, ("x", 0, 1, 1)))
    with pytest.raises(RankChannelError, match="rank 4 of 4"):
        RankInfo.detect(env_of(HVD, (4, 0, 4, 4)))


def config_for(tmp_path, layout, channels=None, modes=None) -> ContainerConfig:
    names = list(channels if channels is not None else layout.channel_names)
    write_opt_ml(tmp_path, {n: (modes or {}).get(n, "Pipe") for n in names}, layout=layout)
    return ContainerConfig.load(tmp_path, environ={})


def test_per_rank_layout_maps_each_rank_to_its_own_channel(tmp_path):
    # the shared validation channel is File mode: a Pipe one would have 2 readers per host
    config = config_for(tmp_path, plan_layout(2, 2, validation="single"), modes={"validation": "File"})
    seen = [check_rank_channels(config, RankInfo(r, r % 2, 4, 2)) for r in range(4)]
    assert seen == ["train_0", "train_1", "train_2", "train_3"]
    modes = ("Pipe", "File")
    shared = check_rank_channels(config, RankInfo(3, 1, 4, 2), role="validation", input_modes=modes)
    assert shared == "validation"


def test_per_local_rank_layout_uses_the_local_rank(tmp_path):
    layout = plan_layout(8, 4)  # 32 ranks do not fit in 20 channels: one channel per local rank
    config = config_for(tmp_path, layout)
    assert layout.strategy == "per-local-rank"
    assert check_rank_channels(config, RankInfo(13, 1, 32, 4)) == "train_1"


def test_more_ranks_than_channels_names_rank_expected_channel_and_channels_present(tmp_path):
    config = config_for(tmp_path, plan_layout(1, 2))
    with pytest.raises(RankChannelError) as info:
        check_rank_channels(config, RankInfo(2, 2, 3, 3))
    message = str(info.value)
    assert "rank 2 (local rank 2; 3 rank(s), 3 per host)" in message
    assert "expected channel 'train_2'" in message
    assert "has 2 train channel(s) (train_0, train_1) for 1 host(s) x 2 process(es)" in message
    assert "but the job runs 3 ranks" in message
    assert "Channels present: train_0, train_1." in message


def test_fewer_ranks_than_channels_fails_too(tmp_path):
    # Rank 0 of 1 would find train_0 but train_1 would never be read: the check says so on every rank.
    config = config_for(tmp_path, plan_layout(1, 2))
    with pytest.raises(RankChannelError, match="has 2 train channel.*but the job runs 1 ranks"):
        check_rank_channels(config, RankInfo(0, 0, 1, 1))


def test_per_local_rank_mismatch_compares_with_the_local_size(tmp_path):
    config = config_for(tmp_path, plan_layout(8, 4))
    with pytest.raises(RankChannelError, match="has 4 train channel.*but the job runs 8 ranks per host"):
        check_rank_channels(config, RankInfo(5, 5, 64, 8))


def test_missing_channel_file_mode_and_missing_layout(tmp_path):
    layout = plan_layout(1, 2)
    config = config_for(tmp_path / "a", layout, channels=["train_0", "other"])
    with pytest.raises(
        RankChannelError, match=r"1 of the layout's 2 train channel\(s\) exist \(missing: train_1\)"
    ):
        check_rank_channels(config, RankInfo(1, 1, 2, 2))
    config = config_for(tmp_path / "b", layout, modes={"train_1": "File"})
    with pytest.raises(RankChannelError, match="expected channel 'train_1': its TrainingInputMode is 'File'"):
        check_rank_channels(config, RankInfo(1, 1, 2, 2))
    write_opt_ml(tmp_path / "c", ["train_0"])
    with pytest.raises(RankChannelError, match="hyperparameter 'sagemaker_dist_layout' is missing"):
        check_rank_channels(ContainerConfig.load(tmp_path / "c", environ={}), RankInfo(0, 0, 1, 1))
    with pytest.raises(RankChannelError, match="no 'validation' channels"):
        check_rank_channels(config, RankInfo(0, 0, 2, 2), role="validation")


# A training script as a user would write it: the check (inside rank_dataset) comes before
# importing Horovod and before any collective op.
SCRIPT = textwrap.dedent(
    """
    import sys, time
    start = time.monotonic()
    from sagemaker_dist.runtime import rank_dataset
    try:
        rank_dataset("train", "TFRecord")
    except ValueError as exc:
        print(f"FAILED after {time.monotonic() - start:.2f}s: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
    import horovod.tensorflow as hvd
    hvd.init()
    hvd.allreduce(1.0)
    """
)


def test_mismatch_fails_fast_in_a_real_process(tmp_path):
    write_opt_ml(tmp_path, ["train_0", "train_1"], layout=plan_layout(1, 2))
    env = {**os.environ, ROOT_ENV: str(tmp_path), **env_of(OMPI, (2, 2, 3, 3))}
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=60
    )
    elapsed = time.monotonic() - start
    assert result.returncode == 1, result.stderr
    assert "rank 2 (local rank 2; 3 rank(s), 3 per host): expected channel 'train_2'" in result.stderr
    assert "Channels present: train_0, train_1" in result.stderr
    assert elapsed < 10, f"took {elapsed:.1f} s"


@pytest.mark.skipif(
    shutil.which("horovodrun") is None
    and not os.path.exists(os.path.join(os.path.dirname(sys.executable), "horovodrun")),
    reason="horovodrun not installed",
)
def test_mismatch_under_horovodrun_fails_fast_instead_of_stalling(tmp_path):
    # Layout planned for 3 processes per host, job launched with 2: without the check, rank 0 and 1
    # would train while train_2 is never read; with it, both ranks stop at once with the reason.
    write_opt_ml(tmp_path, ["train_0", "train_1", "train_2"], layout=plan_layout(1, 3))
    (tmp_path / "script.py").write_text(SCRIPT)
    horovodrun = shutil.which("horovodrun") or os.path.join(os.path.dirname(sys.executable), "horovodrun")
    env = {**os.environ, ROOT_ENV: str(tmp_path)}
    for name in OMPI + HVD:
        env.pop(name, None)
    start = time.monotonic()
    result = subprocess.run(
        [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, str(tmp_path / "script.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.monotonic() - start
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    # horovodrun kills the other rank as soon as one fails, so at least one of them reports.
    assert "expected channel 'train_0'" in output or "expected channel 'train_1'" in output
    assert "has 3 train channel(s) (train_0, train_1, train_2)" in output
    assert elapsed < 10, f"took {elapsed:.1f} s"


REBUILD = (
    r"HOROVOD_WITH_MPI=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 pip install --no-build-isolation "
    r"--no-cache-dir --force-reinstall --no-deps horovod==0\.28\.1, or run scripts/setup\.sh"
)


def test_a_horovod_without_mpi_under_mpirun_is_named_not_the_layout():
    mpirun = {"OMPI_COMM_WORLD_SIZE": "2"}
    for mpi_built, known in ((False, r" \(horovod\.tensorflow\.mpi_built\(\) is False\)"), (None, "")):
        with pytest.raises(
            HorovodWorldError,
            match=r"^mpirun started 2 processes \(OMPI_COMM_WORLD_SIZE=2\), but Horovod initialised a world "
            rf"of 1: this Horovod was built without MPI{known}, so under mpirun each process starts a world "
            rf"of its own and trains alone\. To fix it, rebuild Horovod with Open MPI's headers "
            rf"present.*{REBUILD}",
        ):
            check_horovod_world(mpirun, 1, mpi_built=mpi_built)
    check_horovod_world(mpirun, 2, mpi_built=False)  # the world mpirun started
    check_horovod_world({}, 1, mpi_built=False)  # not under mpirun
    check_horovod_world({"OMPI_COMM_WORLD_SIZE": "x"}, 1)  # not a size: the rank variables' check says so
    check_horovod_world(mpirun, 1, mpi_built=True, mpi_enabled=True)  # MPI's own smaller communicator
    with pytest.raises(
        HorovodWorldError, match=r"has MPI but runs on Gloo \(HOROVOD_CONTROLLER=gloo\).*Unset"
    ):
        check_horovod_world({**mpirun, "HOROVOD_CONTROLLER": "gloo"}, 1, mpi_built=True, mpi_enabled=False)


# Under mpirun, a Horovod that does not run on MPI makes every process a world of one. Horovod's Gloo
# controller does that to an MPI build as a build without MPI does, so it stands in for one here.
SETUP_SCRIPT = textwrap.dedent(
    """
    import sys
    import tensorflow as tf
    from sagemaker_dist.runtime import horovod_keras, rank_dataset
    try:
        horovod_keras.setup(tf.keras.optimizers.legacy.SGD, learning_rate=0.1, batch_size=4)
        rank_dataset("train", "TFRecord")  # the error names the missing channel, not the layout
    except ValueError as exc:
        print(f"FAILED {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
    """
)


@pytest.mark.horovod
@pytest.mark.tensorflow
def test_ranks_of_one_under_mpirun_are_blamed_on_horovod_not_on_the_layout(tmp_path):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun not installed (Open MPI)")
    write_opt_ml(tmp_path, ["train_0", "train_1"], layout=plan_layout(1, 2))
    (tmp_path / "script.py").write_text(SETUP_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in OMPI + HVD}
    env.update({ROOT_ENV: str(tmp_path), "TF_CPP_MIN_LOG_LEVEL": "3"})
    command = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x", ROOT_ENV]
    command += ["-x", "HOROVOD_CONTROLLER=gloo", "-x", "HOROVOD_CPU_OPERATIONS=gloo"]
    result = subprocess.run(
        [*command, sys.executable, str(tmp_path / "script.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "FAILED HorovodWorldError: mpirun started 2 processes (OMPI_COMM_WORLD_SIZE=2), but Horovod " \
        "initialised a world of 1" in output  # fmt: skip
    assert "Launch with as many processes per host" not in output
