"""Defects of the torchrun runtime a user met, each on real parts: Gloo process groups on
127.0.0.1 (one rank in this process, a second in a subprocess), the channel claims' real flocks, real
threads and signals.

- a rendezvous that fails after the channel claims releases them, and a retry in the same process
  starts afresh (on the same port);
- more ranks on a host than GPUs its processes see is refused, naming the GPUs, not shared silently;
- ``setup_ddp(environ=...)`` meets at that environ's ``MASTER_ADDR:MASTER_PORT``, not ``os.environ``'s;
- a process group the script started is not destroyed by ``DdpJob.close`` (nor by a ``PipeTraining``
  stop);
- bad arguments and variables raise the project's ``ConfigurationError``; a channel the job lacks is the
  same ``RankChannelError`` in the readers as in ``setup_ddp`` (it was a ``TypeError`` building its message);
- the reader thread is named after its reader and FIFO (``PipeBatches-train_0_0``), not ``PipeModeDataset``;
- ``StopRequest.install`` off the main thread says that SIGTERM will not be caught;
- a rank that frees its DDP model after destroying its group, while Gloo still finishes a collective,
  exits (it hung in the group's destructor).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import textwrap
import threading
import warnings

import pytest
from helpers.runtime_helpers import write_opt_ml

from sagemaker_dist.contract.layout import plan_layout
from sagemaker_dist.errors import ConfigurationError, JobFailedError
from sagemaker_dist.runtime.ranks import RankChannelError

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(root, rank: int, size: int, port: int | None = None) -> dict[str, str]:
    env = {
        "SAGEMAKER_DIST_OPT_ML": str(root),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(size),
        "LOCAL_WORLD_SIZE": str(size),
    }
    if port is not None:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return env


def _job_root(tmp_path, ranks: int):
    layout = plan_layout(1, ranks)
    return write_opt_ml(tmp_path / "opt_ml", layout.channel_names, layout)


def _claim_is_free(root, channel: str) -> bool:
    """Whether a fresh claim on ``channel`` succeeds here (then it is given back)."""
    from sagemaker_dist.runtime.config import ContainerConfig
    from sagemaker_dist.runtime.torch.process_group import ChannelClaim

    try:
        ChannelClaim(ContainerConfig.load(root, {}), channel, "probe").release()
    except RankChannelError:
        return False
    return True


@pytest.fixture
def no_group():
    """No default process group before the test, none left after it."""
    import torch.distributed as dist

    assert not dist.is_initialized()
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


PEER = textwrap.dedent(
    """
    import json, sys
    from sagemaker_dist.runtime import setup_ddp

    job = setup_ddp(environ=json.loads(sys.argv[1]), timeout_s=60)
    print("peer", job.mean({"rank": float(job.rank)}), flush=True)
    job.close()
    """
)


# --- 1. a failure after the claims releases them ---


def test_a_failed_rendezvous_releases_the_claims_and_a_retry_in_the_process_meets_its_peer(
    tmp_path, monkeypatch, no_group
):
    import torch.distributed as dist

    from sagemaker_dist.runtime import setup_ddp

    root, port = _job_root(tmp_path, 2), _free_port()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")  # as torchrun sets them for the process
    monkeypatch.setenv("MASTER_PORT", str(port))
    with pytest.raises(RuntimeError) as failed:  # rank 1 never comes
        setup_ddp(environ=_env(root, 0, 2, port), timeout_s=1)
    assert not dist.is_initialized()
    assert _claim_is_free(root, "train_0"), "the failed setup_ddp still holds rank 0's channel"
    assert isinstance(failed.value, JobFailedError)
    assert (
        f"rank 0 of 2: the gloo process group did not start: the ranks did not all meet at 127.0.0.1:{port}"
        in (str(failed.value))
    )

    # the retry, with its peer this time, on the same port (the failed attempt's store is gone)
    peer = subprocess.Popen(
        [sys.executable, "-c", PEER, __import__("json").dumps(_env(root, 1, 2, port))],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        job = setup_ddp(environ=_env(root, 0, 2, port), timeout_s=60)
        assert (job.rank, job.world_size, job.created_group) == (0, 2, True)
        assert job.mean({"rank": 0.0}) == {"rank": 0.5}
        assert not _claim_is_free(root, "train_0")  # held by the job now
        job.close()
        out, _ = peer.communicate(timeout=60)
    finally:
        peer.kill()
    assert peer.returncode == 0, out
    assert "peer {'rank': 0.5}" in out
    assert not dist.is_initialized()
    assert _claim_is_free(root, "train_0") and _claim_is_free(root, "train_1")


def test_a_rendezvous_without_its_address_fails_before_any_wait_and_holds_no_claim(
    tmp_path, monkeypatch, no_group
):
    from sagemaker_dist.runtime import setup_ddp

    root = _job_root(tmp_path, 2)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(RankChannelError, match=r"MASTER_ADDR and MASTER_PORT not set: the ranks meet at"):
        setup_ddp(environ=_env(root, 0, 2))
    assert _claim_is_free(root, "train_0")
    with pytest.raises(RankChannelError, match=r"MASTER_PORT='http': give a port number from 1 to 65535"):
        setup_ddp(environ={**_env(root, 0, 2), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "http"})
    assert _claim_is_free(root, "train_0")


# --- 2. one GPU per rank, or a clear refusal ---


@pytest.mark.parametrize(
    "local_rank, local_size, gpus, expected",
    [(0, 1, 1, 0), (0, 2, 2, 0), (1, 2, 2, 1), (3, 4, 8, 3), (7, 8, 8, 7)],
)
def test_each_local_rank_gets_a_gpu_of_its_own(local_rank, local_size, gpus, expected):
    from sagemaker_dist.runtime.torch.process_group import cuda_device_index

    assert cuda_device_index(local_rank, local_size, gpus, None) == expected


@pytest.mark.parametrize(
    "local_rank, local_size, gpus, visible, seen",
    [
        # 4 ranks, 2 GPUs: local_rank % 2 put ranks 0 and 2 on GPU 0; every rank of the host refuses
        (0, 4, 2, "0,1", "sees 2 GPU(s) (CUDA_VISIBLE_DEVICES='0,1')"),
        (3, 4, 2, None, "sees 2 GPU(s) (CUDA_VISIBLE_DEVICES is not set: every GPU of the host)"),
        # CUDA_VISIBLE_DEVICES=0 for all 8 ranks torchrun started: all on one GPU
        (5, 8, 1, "0", "sees 1 GPU(s) (CUDA_VISIBLE_DEVICES='0')"),
    ],
)
def test_more_ranks_on_a_host_than_visible_gpus_is_refused_with_what_to_do(
    local_rank, local_size, gpus, visible, seen
):
    from sagemaker_dist.runtime.torch.process_group import DeviceAssignmentError, cuda_device_index

    with pytest.raises(DeviceAssignmentError) as refused:
        cuda_device_index(local_rank, local_size, gpus, visible)
    message = str(refused.value)
    assert (
        f"local rank {local_rank} of LOCAL_WORLD_SIZE={local_size}: this host runs {local_size} rank(s)"
        in (message)
    )
    assert seen in message
    assert f"Start at most {gpus} process(es) per host (torchrun --nproc_per_node {gpus}" in message
    assert f"list {local_size} GPUs in it" in message
    assert isinstance(refused.value, ConfigurationError)


# --- 3. the environ given is the rendezvous too ---


def test_setup_ddp_meets_at_the_master_of_the_environ_it_is_given(tmp_path, monkeypatch, no_group):
    import torch.distributed as dist

    from sagemaker_dist.runtime import setup_ddp

    root, port = _job_root(tmp_path, 1), _free_port()
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    job = setup_ddp(environ=_env(root, 0, 1, port), timeout_s=30)
    assert dist.is_initialized() and dist.get_world_size() == 1 and job.created_group
    assert job.mean({"loss": 2.0}) == {"loss": 2.0}
    job.close()
    assert not dist.is_initialized()


# --- a process group the script started stays its own ---


def _own_group(port: int) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def test_close_leaves_a_process_group_the_script_started(tmp_path, no_group):
    import torch.distributed as dist

    from sagemaker_dist.runtime import setup_ddp

    root, port = _job_root(tmp_path, 1), _free_port()
    _own_group(port)
    job = setup_ddp(environ=_env(root, 0, 1, port))
    assert not job.created_group
    job.close()
    job.close()  # again: nothing
    assert dist.is_initialized(), "DdpJob.close destroyed the process group the script had started"
    assert _claim_is_free(root, "train_0")


def test_a_stop_in_pipe_training_leaves_a_process_group_the_script_started(tmp_path, no_group):
    import torch.distributed as dist

    from sagemaker_dist.runtime import PipeTraining, setup_ddp
    from sagemaker_dist.runtime.torch.stop import TrainingStopped

    root, port = _job_root(tmp_path, 1), _free_port()
    _own_group(port)
    job = setup_ddp(environ=_env(root, 0, 1, port))
    model = torch.nn.Linear(2, 1)
    training = PipeTraining(
        job, model, torch.optim.SGD(model.parameters(), lr=0.1), epochs=1, checkpoint_dir=False
    )
    with pytest.raises(TrainingStopped):
        for _ in training.epochs():
            for _ in training.batches([torch.ones(1, 2)] * 4):
                training.stop.request("a test's stop")
    assert dist.is_initialized(), "PipeTraining's stop destroyed the process group the script had started"


# --- a rank whose DDP model outlives its group still exits ---

FREES_ITS_MODEL_LAST = textwrap.dedent(
    """
    import json, sys, time
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from sagemaker_dist.runtime import setup_ddp

    env = json.loads(sys.argv[1])
    job = setup_ddp(environ=env, timeout_s=60)
    model = DDP(torch.nn.Linear(1, 1))
    model(torch.ones(1, 1)).sum().backward()
    if job.rank == 0:
        # a collective whose tensor only Gloo's thread holds, still waiting for rank 1
        pending = torch.ones(1)
        dist.all_reduce(pending, async_op=True)
        del pending
        dist.destroy_process_group()
        del model  # the reducer held the group last: before, ~ProcessGroupGloo joined with the GIL held
        print("rank 0 freed its model", flush=True)
    else:
        time.sleep(2)
        dist.all_reduce(torch.ones(1))
        dist.destroy_process_group()
    print(f"rank {job.rank} ends", flush=True)
    """
)


def test_a_rank_that_frees_its_ddp_model_after_its_group_exits_while_gloo_finishes_a_collective(tmp_path):
    """The group a DDP model's reducer held last was destroyed with the GIL held, while Gloo's thread
    waited for the GIL to free the finished collective's tensor: rank 0 never exited (before the fix
    this test's rank 0 ran into its 60 s; seen in local-mode jobs after their last step)."""
    root, port = _job_root(tmp_path, 2), _free_port()
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", FREES_ITS_MODEL_LAST, __import__("json").dumps(_env(root, r, 2, port))],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    outputs = []
    try:
        for rank in ranks:
            outputs.append(rank.communicate(timeout=60)[0])
    except subprocess.TimeoutExpired:
        pytest.fail(f"rank {len(outputs)} did not exit within 60 s after freeing its DDP model")
    finally:
        for rank in ranks:
            rank.kill()
    assert [rank.returncode for rank in ranks] == [0, 0], outputs
    assert "rank 0 freed its model" in outputs[0] and "rank 0 ends" in outputs[0], outputs[0]
    assert "rank 1 ends" in outputs[1], outputs[1]


# --- 4. the project's error families ---


@pytest.mark.parametrize("timeout_s", [0, -5, "soon", float("inf"), True])
def test_a_timeout_that_is_no_number_of_seconds_is_a_configuration_error(tmp_path, timeout_s):
    from sagemaker_dist.runtime import setup_ddp

    root = _job_root(tmp_path, 1)
    with pytest.raises(ConfigurationError, match=r"timeout_s=.*: give a number of seconds > 0, or None"):
        setup_ddp(environ=_env(root, 0, 1), timeout_s=timeout_s)
    assert _claim_is_free(root, "train_0")


@pytest.mark.parametrize("grace", ["soon", "0", "-1", "inf"])
def test_a_stop_grace_that_is_no_number_of_seconds_is_a_configuration_error(monkeypatch, grace):
    from sagemaker_dist.runtime.torch.stop import GRACE_ENV, install_stop

    monkeypatch.setenv(GRACE_ENV, grace)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(ConfigurationError, match=rf"{GRACE_ENV}='{grace}': give the seconds from SIGTERM"):
        install_stop(0)
    assert signal.getsignal(signal.SIGTERM) is before
    with pytest.raises(ConfigurationError, match=r"grace=0: give the seconds"):
        install_stop(0, grace=0)


def test_a_channel_not_in_the_job_is_the_same_rank_channel_error_as_setup_ddps(tmp_path):
    from sagemaker_dist.runtime import PipeBatches, RecordBatches
    from sagemaker_dist.runtime.config import ContainerConfig

    config = ContainerConfig.load(_job_root(tmp_path, 2), {})
    for reader in (PipeBatches, RecordBatches):
        with pytest.raises(RankChannelError, match=r"channel 'train_7' is not in the job's inputdataconfig"):
            reader("train_7", 4, config=config)


@pytest.mark.parametrize("arguments", [{"batch_size": 0}, {"prefetch": 0}, {"device": "no-such-device"}])
def test_a_reader_argument_out_of_range_is_a_configuration_error(tmp_path, arguments):
    from sagemaker_dist.runtime import PipeBatches
    from sagemaker_dist.runtime.config import ContainerConfig

    config = ContainerConfig.load(_job_root(tmp_path, 1), {})
    settings = {"batch_size": 4, **arguments}
    with pytest.raises(ConfigurationError, match=rf"{next(iter(arguments))}="):
        PipeBatches("train_0", config=config, **settings)


@pytest.mark.parametrize("reader_class", ["PipeBatches", "RecordBatches"])
def test_the_reader_thread_is_named_after_the_reader_and_its_fifo(tmp_path, reader_class):
    from helpers.runtime_helpers import FifoFeeder

    from sagemaker_dist import runtime
    from sagemaker_dist.contract.record_formats import encode_tfrecord
    from sagemaker_dist.runtime.config import ContainerConfig

    root = _job_root(tmp_path, 1)
    # more than the reader reads ahead (8 MiB): its thread is still reading when the threads are listed
    epoch = encode_tfrecord(b"x" * 1024) * 8192
    feeder = FifoFeeder(root / "input" / "data", "train_0", [epoch])
    feeder.start()
    reader = getattr(runtime, reader_class)("train_0", 4, config=ContainerConfig.load(root, {}))
    batches = iter(reader)
    next(batches)
    names = [t.name for t in threading.enumerate() if t.name.endswith("-train_0_0")]
    batches.close()
    feeder.join(10)
    assert names == [f"{reader_class}-train_0_0"]


@pytest.mark.parametrize("skip", [-1, "2", 1.5])
def test_a_skip_that_is_no_count_of_batches_is_a_configuration_error(skip):
    from sagemaker_dist.runtime.torch.epochs import agreed_batches

    with pytest.raises(ConfigurationError, match=r"skip=.*: give the batches to drop first"):
        agreed_batches([1, 2, 3], skip=skip)


# --- 5. a stop set up off the main thread says so ---


def test_a_stop_installed_off_the_main_thread_warns_that_sigterm_will_not_be_caught():
    from sagemaker_dist.runtime.torch.stop import install_stop

    before = signal.getsignal(signal.SIGTERM)
    seen: list = []

    def trainer():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            stop = install_stop(3)
        seen.extend(caught)
        stop.uninstall()  # nothing to give back

    thread = threading.Thread(target=trainer, name="ray-train-runner")
    thread.start()
    thread.join(10)
    assert [w.category for w in seen] == [RuntimeWarning]
    message = str(seen[0].message)
    assert (
        "rank 3: the stop on SIGTERM was set up in thread 'ray-train-runner', not the main thread" in message
    )
    assert "SIGTERM (a stop or a spot interruption) will not be caught" in message
    assert "no stop checkpoint will be written" in message
    assert signal.getsignal(signal.SIGTERM) is before

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the main thread's install takes SIGTERM, without a word
        stop = install_stop(0)
    try:
        assert signal.getsignal(signal.SIGTERM) == stop._on_signal
    finally:
        stop.uninstall()
    assert signal.getsignal(signal.SIGTERM) is before
