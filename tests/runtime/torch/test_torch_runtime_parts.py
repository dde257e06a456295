"""The torchrun runtime's parts in one process (no process group): Example records without TensorFlow,
the channel claim and checks before any collective, PipeBatches over a real FIFO, checkpoints."""

from __future__ import annotations

import struct
import time

import numpy as np
import pytest
from helpers.protobuf_wire import field as _field
from helpers.protobuf_wire import varint as _varint
from helpers.runtime_helpers import FifoFeeder, write_opt_ml

from sagemaker_dist.contract.distributions import TORCHRUN_ENTRY
from sagemaker_dist.contract.layout import HOROVOD, TF_MWMS, plan_layout
from sagemaker_dist.contract.record_formats import encode_tfrecord
from sagemaker_dist.local.demo_data import encode_example
from sagemaker_dist.runtime.framing.base import RecordFormatError
from sagemaker_dist.runtime.ranks import RankChannelError
from sagemaker_dist.runtime.torch.records import ExampleParseError, parse_example

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch


def _entry(name: str, feature: bytes) -> bytes:
    return _field(1, _field(1, name.encode()) + _field(2, feature))


# --- tf.train.Example without TensorFlow ---


def test_parse_example_reads_bytes_int64_and_float_lists():
    record = encode_example({"image": b"\x00\xffpng", "label": 7, "ids": [1, 300, 2**40]})
    parsed = parse_example(record)
    assert parsed["image"] == [b"\x00\xffpng"]
    assert parsed["label"].tolist() == [7] and parsed["label"].dtype == np.int64
    assert parsed["ids"].tolist() == [1, 300, 2**40]
    unpacked = b"".join(_varint(1 << 3 | 5) + struct.pack("<f", v) for v in (1.5, -2.0))
    negative = _varint(1 << 3 | 0) + _varint((-3) & 0xFFFFFFFFFFFFFFFF)
    unknown = _varint(9 << 3 | 0) + _varint(5) + _field(10, b"ignored")
    record = _field(
        1,
        _entry("packed", _field(2, _field(1, struct.pack("<3f", 0.5, 1.0, 2.5))))
        + _entry("unpacked", _field(2, unpacked))
        + _entry("neg", _field(3, negative))
        + _entry("empty", b""),
    )
    parsed = parse_example(unknown + record)
    assert parsed["packed"].tolist() == [0.5, 1.0, 2.5] and parsed["packed"].dtype == np.float32
    assert parsed["unpacked"].tolist() == [1.5, -2.0]
    assert parsed["neg"].tolist() == [-3]
    assert parsed["empty"] == []


def test_parse_example_is_bounded_on_truncated_and_lying_records():
    record = encode_example({"image": b"x" * 50, "label": [1, 2, 3]})
    for cut in range(len(record)):
        try:
            parse_example(record[:cut])
        except ExampleParseError:
            pass  # any other exception (IndexError, MemoryError, ...) fails the test
    claims_a_gigabyte = _varint(1 << 3 | 2) + _varint(1 << 30) + b"abc"
    with pytest.raises(ExampleParseError, match="claims 1073741824 bytes"):
        parse_example(claims_a_gigabyte)
    with pytest.raises(ExampleParseError, match="varint longer"):
        parse_example(b"\x08" + b"\xff" * 11)
    with pytest.raises(ExampleParseError, match="wire type 7"):
        parse_example(b"\x0f")


def test_example_decoder_makes_shaped_tensors_and_names_a_missing_feature():
    from sagemaker_dist.runtime import example_decoder, raw_decoder

    decode = example_decoder({"label": "int64", "pixels": ("int64", [2, 2])})
    sample = decode(encode_example({"label": 3, "pixels": [1, 2, 3, 4], "other": b"x"}))
    assert sample["label"].tolist() == [3] and sample["pixels"].shape == (2, 2)
    with pytest.raises(ExampleParseError, match="no feature 'pixels'"):
        decode(encode_example({"label": 3}))
    assert raw_decoder("int16", [2])(struct.pack("<2h", -1, 7)).tolist() == [-1, 7]


# --- the checks before the first collective ---


def _rank_env(root, rank: int, size: int = 2) -> dict[str, str]:
    return {
        "SAGEMAKER_DIST_OPT_ML": str(root),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(size),
        "LOCAL_WORLD_SIZE": str(size),
    }


def test_a_second_reader_of_a_channel_on_the_host_fails_at_once(tmp_path):
    from sagemaker_dist.runtime.config import ContainerConfig
    from sagemaker_dist.runtime.torch.process_group import ChannelClaim

    root = write_opt_ml(tmp_path / "opt_ml", ["train_0", "train_1"], plan_layout(1, 2))
    config = ContainerConfig.load(root, {})
    first = ChannelClaim(config, "train_0", "rank 0")
    started = time.monotonic()
    with pytest.raises(RankChannelError, match=r"'train_0' is already read by another process .*pid \d+"):
        ChannelClaim(config, "train_0", "rank 1")
    assert time.monotonic() - started < 0.5
    first.release()
    ChannelClaim(config, "train_0", "rank 1").release()  # free again once the first reader is gone


def test_a_pipe_channel_every_rank_would_read_fails_before_the_process_group(tmp_path):
    import torch.distributed as dist

    from sagemaker_dist.runtime import setup_ddp

    layout = plan_layout(1, 2, validation="single")
    root = write_opt_ml(tmp_path / "opt_ml", layout.channel_names, layout)
    started = time.monotonic()
    with pytest.raises(RankChannelError, match="a FIFO has one reader only"):
        setup_ddp(("train", "validation"), environ=_rank_env(root, 0))
    assert time.monotonic() - started < 0.5
    assert not dist.is_initialized()


def _launched_env(root, **variables: str) -> dict[str, str]:
    return {"SAGEMAKER_DIST_OPT_ML": str(root), **variables}


@pytest.mark.parametrize(
    "distribution, variables, title",
    [
        # launched without --distribution torchrun: the default, Horovod under horovodrun (local mode)
        (HOROVOD, {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2"}, "Horovod"),
        # ... or under the toolkit's mpirun, and a tf-mwms job's worker under TF_CONFIG
        (HOROVOD, {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}, "Horovod"),
        (TF_MWMS, {"TF_CONFIG": '{"task": {"type": "worker", "index": 1}}'}, "MultiWorkerMirroredStrategy"),
        (HOROVOD, {}, "Horovod"),  # no rank variables at all, but the layout has 2 ranks
    ],
)
def test_a_job_launched_for_another_distribution_is_named_with_the_distribution_to_use(
    tmp_path, distribution, variables, title
):
    """A PyTorch script launched without --distribution torchrun runs as another distribution's job: the
    check names that distribution and the one to launch with, not the processes per host."""
    import torch.distributed as dist

    from sagemaker_dist.contract.distributions import distribution as entry
    from sagemaker_dist.runtime import setup_ddp

    layout = plan_layout(2, 1, distribution=distribution)
    root = write_opt_ml(tmp_path / "opt_ml", layout.channel_names, layout, hosts=("algo-1", "algo-2"))
    with pytest.raises(RankChannelError) as raised:
        setup_ddp(environ=_launched_env(root, **variables))
    message = str(raised.value)
    assert f"launched as a {title} job (distribution {entry(distribution).name!r}" in message
    assert (
        "Launch it with --distribution torchrun (distribution='torchrun' on the DistributedEstimator)"
        in message
    )
    assert "sagemaker_mpi_num_of_processes_per_host" not in message
    assert not dist.is_initialized()


def test_a_job_without_a_layout_is_named_by_its_toolkit_switch(tmp_path):
    from sagemaker_dist.contract.hyperparameters import MPI_ENABLED
    from sagemaker_dist.runtime import setup_ddp

    root = write_opt_ml(tmp_path / "opt_ml", ["train_0"], hyperparameters={MPI_ENABLED: True})
    with pytest.raises(RankChannelError, match=r"launched as a Horovod job .*--distribution torchrun"):
        setup_ddp(environ=_launched_env(root, OMPI_COMM_WORLD_RANK="0"))


def test_torchrun_ranks_and_a_plain_run_of_a_one_rank_job_pass_the_distribution_check(tmp_path):
    from sagemaker_dist.runtime.config import ContainerConfig
    from sagemaker_dist.runtime.torch.process_group import check_launched_for_torchrun

    layout = plan_layout(1, 2)  # the default distribution's layout, but torchrun started the ranks
    root = write_opt_ml(tmp_path / "a" / "opt_ml", layout.channel_names, layout)
    check_launched_for_torchrun(ContainerConfig.load(root, {}), _rank_env(root, 1))
    single = plan_layout(1, 1)
    root = write_opt_ml(tmp_path / "b" / "opt_ml", single.channel_names, single)
    check_launched_for_torchrun(ContainerConfig.load(root, {}), _launched_env(root))  # python train.py
    torch_layout = plan_layout(2, 1, distribution=TORCHRUN_ENTRY.name)
    root = write_opt_ml(tmp_path / "c" / "opt_ml", torch_layout.channel_names, torch_layout)
    check_launched_for_torchrun(ContainerConfig.load(root, {}), _launched_env(root))


def test_pipe_training_syncs_tensorboard_at_the_interval_it_is_given(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from sagemaker_dist.runtime import PipeTraining, tensorboard_sync

    started = []

    class Syncer:
        def __init__(self, log_dir, s3_uri, **options):
            started.append((s3_uri, options))

        def start(self):
            return self

    monkeypatch.setattr(tensorboard_sync, "TensorBoardSyncer", Syncer)
    job = SimpleNamespace(rank=0, is_chief=True, config=None)
    model = torch.nn.Linear(2, 1)
    common = {"epochs": 1, "checkpoint_dir": False, "stop": False, "tensorboard_dir": tmp_path / "tb"}
    for interval in ({"tensorboard_interval": 5}, {}):
        PipeTraining(job, model, tensorboard_s3_uri="s3://b/tb", **interval, **common).writer.close()
    assert started == [("s3://b/tb", {"interval": 5.0}), ("s3://b/tb", {})]  # the syncer's default: 30 s
    with pytest.raises(ValueError, match="tensorboard_interval=0: give a number of seconds > 0"):
        PipeTraining(job, model, tensorboard_interval=0, **common)


# --- PipeBatches over a real FIFO ---


def test_pipe_batches_reads_one_fifo_per_epoch_and_closes_an_epoch_left_early(tmp_path):
    from sagemaker_dist.runtime import PipeBatches, example_decoder

    root = write_opt_ml(tmp_path / "opt_ml", ["train_0", "train_1"], plan_layout(1, 2))
    records = b"".join(encode_tfrecord(encode_example({"id": i})) for i in range(10))
    feeder = FifoFeeder(root / "input" / "data", "train_0", [records, records])
    feeder.start()
    from sagemaker_dist.runtime.config import ContainerConfig

    batches = PipeBatches("train_0", 4, decode=example_decoder(["id"]), config=ContainerConfig.load(root, {}))
    first = [b["id"].view(-1).tolist() for b in batches]
    assert first == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    for batch in batches:  # the second epoch: one batch taken, the rest of the FIFO closed unread
        assert batch["id"].shape == (4, 1)
        break
    feeder.join(10)
    assert feeder.served == 2 and feeder.error is None
    assert batches.epochs_opened == 2


def test_pipe_batches_refuses_a_skip_count_its_format_cannot_honour(tmp_path):
    from sagemaker_dist.errors import ConfigurationError
    from sagemaker_dist.runtime import PipeBatches, RecordBatches
    from sagemaker_dist.runtime.config import ContainerConfig

    root = write_opt_ml(tmp_path / "opt_ml", ["train_0"], plan_layout(1, 1))
    config = ContainerConfig.load(root, {})
    for reader in (PipeBatches, RecordBatches):
        with pytest.raises(ConfigurationError, match="record_format='TFRecord' .got 'TextLine'"):
            reader("train_0", 4, record_format="TextLine", max_corrupted_records_to_skip=1, config=config)
        assert reader("train_0", 4, max_corrupted_records_to_skip=1, config=config).max_skip == 1


def test_pipe_batches_reads_a_file_channel_whole_every_epoch_in_a_stable_order(tmp_path):
    from sagemaker_dist.runtime import PipeBatches, example_decoder
    from sagemaker_dist.runtime.config import ContainerConfig
    from sagemaker_dist.runtime.file_channel import FileChannelError

    root = write_opt_ml(tmp_path / "opt_ml", {"train_0": "File"}, plan_layout(1, 1, input_mode="File"))
    channel = root / "input" / "data" / "train_0"
    (channel / "b").mkdir(parents=True)
    for name, ids in (("b/part-1", range(3, 7)), ("a-part-0", range(3)), (".hidden", range(100, 102))):
        (channel / name).write_bytes(b"".join(encode_tfrecord(encode_example({"id": i})) for i in ids))
    config = ContainerConfig.load(root, {})
    batches = PipeBatches("train_0", 4, decode=example_decoder(["id"]), config=config)
    epochs = [[b["id"].view(-1).tolist() for b in batches] for _ in range(2)]
    # a-part-0 then b/part-1, a batch across the two files, the hidden file left out; each epoch whole
    assert epochs == [[[0, 1, 2, 3], [4, 5, 6]]] * 2
    assert batches.records == 14 and batches.epochs_opened == 2
    (channel / "a-part-0").write_bytes(encode_tfrecord(b"x")[:-3])  # a truncated record fails the epoch
    with pytest.raises(RecordFormatError, match="train_0"):
        list(batches)
    with pytest.raises(FileChannelError, match="Pipe mode only"):
        PipeBatches("train_0", 4, config=config, max_corrupted_records_to_skip=1)


# --- checkpoints ---


def test_checkpoints_restore_the_newest_complete_one_and_refuse_another_model(tmp_path):
    from sagemaker_dist.runtime import restore_torch_checkpoint, save_torch_checkpoint
    from sagemaker_dist.runtime.checkpoint_format import CheckpointMismatchError

    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(2, 3)).sum().backward()
    optimizer.step()
    save_torch_checkpoint(tmp_path, 1, model=model, optimizer=optimizer)
    saved = save_torch_checkpoint(tmp_path, 1, 4, model=model, optimizer=optimizer, extra={"seen": 12})
    (tmp_path / ".tmp-epoch-00002-1-1").mkdir()  # a writer that crashed: never complete
    (tmp_path / "epoch-00003").mkdir()  # a half-synced copy without meta.json: not complete either
    fresh = torch.nn.Linear(3, 1)
    fresh_optimizer = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    epoch, step, found, extra = restore_torch_checkpoint(
        tmp_path, model=fresh, optimizer=fresh_optimizer, rank=0
    )
    assert (epoch, step, found.path, extra) == (1, 4, saved.path, {"seen": 12})
    assert torch.equal(fresh.weight, model.weight)
    assert fresh_optimizer.state_dict()["state"][0]["momentum_buffer"].shape == (1, 3)
    assert not (tmp_path / ".tmp-epoch-00002-1-1").exists()
    with pytest.raises(CheckpointMismatchError, match="does not match"):
        restore_torch_checkpoint(tmp_path, model=torch.nn.Linear(5, 1), rank=0)


class _RunsCode:
    """A pickle that runs code when loaded: what a planted ``state.pt`` would carry."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def test_a_planted_state_pt_that_runs_code_is_refused_and_never_runs(tmp_path):
    import json

    from sagemaker_dist.runtime.torch.checkpointing import UnsafeCheckpointError, restore_torch_checkpoint

    marker = tmp_path / "ran-as-the-job"
    planted = tmp_path / "checkpoints" / "epoch-00002"
    planted.mkdir(parents=True)
    torch.save({"model": {}, "payload": _RunsCode(marker)}, planted / "state.pt")
    size = (planted / "state.pt").stat().st_size
    meta = {"format": "torch", "epoch": 2, "step": 0, "files": {"state.pt": size}}
    (planted / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(
        UnsafeCheckpointError, match=r"epoch-00002/state\.pt holds objects other than tensors"
    ):
        restore_torch_checkpoint(planted.parent, model=torch.nn.Linear(3, 1), rank=0)
    assert not marker.exists()


def test_a_checkpoint_refuses_at_save_what_it_could_not_load_at_resume(tmp_path):
    from sagemaker_dist.runtime.torch.checkpointing import UnsafeCheckpointError, save_torch_checkpoint

    model = torch.nn.Linear(3, 1)
    with pytest.raises(UnsafeCheckpointError, match="extra= holds objects a checkpoint cannot carry"):
        save_torch_checkpoint(tmp_path, 1, model=model, extra={"why": _RunsCode(tmp_path / "x")})
    assert not list(tmp_path.glob("epoch-*"))
    saved = save_torch_checkpoint(tmp_path, 1, model=model, extra={"seen": torch.arange(3), "ids": [1, "a"]})
    assert saved.path.name == "epoch-00001"


@pytest.mark.parametrize("damage", ["zeros", "truncated"])
def test_a_damaged_state_pt_is_named_damaged_not_unsafe_nor_another_model(tmp_path, damage):
    """A file of the listed size that torch cannot read is a CheckpointReadError naming it; the "would
    run code" and "does not match this job's model" errors are kept for what they say."""
    import json

    from sagemaker_dist.runtime.checkpoint_format import CheckpointMismatchError
    from sagemaker_dist.runtime.torch.checkpointing import (
        CheckpointReadError,
        restore_torch_checkpoint,
        save_torch_checkpoint,
    )

    saved = save_torch_checkpoint(tmp_path, 1, model=torch.nn.Linear(3, 1))
    state = saved.path / "state.pt"
    size = state.stat().st_size
    data = bytes(size) if damage == "zeros" else state.read_bytes()[: size // 2]
    state.write_bytes(data)
    meta = json.loads((saved.path / "meta.json").read_text())
    meta["files"]["state.pt"] = len(data)
    (saved.path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointReadError, match=r"epoch-00001/state\.pt is damaged") as caught:
        restore_torch_checkpoint(tmp_path, model=torch.nn.Linear(3, 1), rank=0)
    assert not isinstance(caught.value, CheckpointMismatchError)
    assert "delete" in str(caught.value) and "checkpoint before it" in str(caught.value)


def test_an_epochs_end_counts_the_records_of_the_batches_a_reader_or_a_collate_hands_out():
    import torch

    from sagemaker_dist.runtime.torch.batch_cutter import RaggedBatch
    from sagemaker_dist.runtime.torch.epochs import records_in

    ragged = RaggedBatch(torch.zeros(10, dtype=torch.uint8), torch.tensor([0, 3, 7, 10]))
    assert records_in(ragged) == 3  # not its 10 bytes
    assert records_in(torch.zeros(5, 32)) == 5
    assert records_in((torch.zeros(6, 2), torch.zeros(6))) == 6  # (inputs, labels)
    assert records_in([torch.zeros(4, 2), torch.zeros(4)]) == 4  # default_collate of list samples
    assert records_in({"image": torch.zeros(7, 3), "label": torch.zeros(7)}) == 7
    assert records_in([b"a", b"bc"]) == 2  # records as bytes
    assert records_in([{"jpg": b"x"}, {"jpg": b"y"}, {"jpg": b"z"}]) == 3  # WebDataset samples
    assert records_in(np.zeros((8, 2))) == 8
    assert records_in([torch.zeros(7), torch.zeros(9)]) == 2  # samples of their own lengths
    assert records_in([torch.tensor(1.0), torch.tensor(2.0)]) == 2  # scalars
    images = tuple(torch.zeros(3, 8, 8) for _ in range(5))  # torchvision detection: images and targets
    assert records_in((images, tuple({"boxes": torch.zeros(2, 4)} for _ in range(5)))) is None  # not 3
    packed = torch.nn.utils.rnn.pack_sequence([torch.zeros(4), torch.zeros(3)])
    assert records_in(packed) == 2  # sequences, not tokens
    nested = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)], layout=torch.jagged)
    assert records_in(nested) in (2, None)  # never an error: a step must not fail on its count
    assert records_in(object()) is None and records_in([]) is None


def test_a_script_counts_the_records_of_batches_whose_structure_cannot_tell_them():
    import torch

    from sagemaker_dist.errors import ConfigurationError
    from sagemaker_dist.runtime.torch.epochs import agreed_batches

    samples = [[torch.zeros(3, 8, 8) for _ in range(5)] for _ in range(2)]  # collate_fn=list: 5 images
    guessed = agreed_batches(samples)
    assert len(list(guessed)) == 2 and guessed.records == 6  # read as fields of 3 records each
    counted = agreed_batches(samples, records=len)
    assert len(list(counted)) == 2 and counted.records == 10
    for wrong in (lambda batch: 1 / 0, lambda batch: -1, lambda batch: 2.5):
        epoch = agreed_batches(samples, records=wrong)
        assert len(list(epoch)) == 2 and epoch.records is None  # never an error: the steps go on
    with pytest.raises(ConfigurationError, match="records=3: give a function of a batch"):
        agreed_batches(samples, records=3)
