"""Inside the training container: rank -> channel -> FIFO, records as tf.data or PyTorch batches, the
Keras helpers for Horovod and MultiWorkerMirroredStrategy.

A framework-neutral core (the modules at this root, ``framing/``, ``epoch_reader/``) with one folder per
framework beside it (``tensorflow/``, ``torch/``). Never imports the SageMaker SDK. A framework is
imported only when one of its names is first used (PEP 562), so ``import sagemaker_dist.runtime`` and
the config/rank checks stay cheap. Module paths of earlier releases (``runtime.keras``, ``runtime.pipe``,
``runtime.horovod_keras``, ...) still import, with a DeprecationWarning (``deprecated_paths``).
"""

from __future__ import annotations

import importlib

from sagemaker_dist.runtime.deprecated_paths import install as _install_old_paths

_install_old_paths()

# public name -> module that defines it
_LAZY = {
    "PipeModeDataset": "sagemaker_dist.runtime.tensorflow.data.pipe_dataset",
    "PipeModeDatasetError": "sagemaker_dist.runtime.tensorflow.data.pipe_dataset",
    # AWS's name for the same class
    "PipeModeDatasetException": "sagemaker_dist.runtime.tensorflow.data.pipe_dataset",
    "rank_dataset": "sagemaker_dist.runtime.tensorflow.data.pipe_dataset",
    # a TensorFlow loop of the script's own: its place in the train channel, for its checkpoints
    "ReaderPosition": "sagemaker_dist.runtime.tensorflow.data.reader_position",
    # SIGTERM (a stop, a spot interruption) as a request a loop of the script's own agrees on at a step
    "StopRequest": "sagemaker_dist.runtime.stop",
    "ContainerConfig": "sagemaker_dist.runtime.config",
    "RankInfo": "sagemaker_dist.runtime.ranks",
    "RankChannelError": "sagemaker_dist.runtime.ranks",
    "check_rank_channels": "sagemaker_dist.runtime.ranks",
    "RecordFormatError": "sagemaker_dist.runtime.framing.base",
    "ShuffleWindow": "sagemaker_dist.runtime.framing.shuffle",
    "ReaderStateError": "sagemaker_dist.runtime.epoch_reader.order",
    "file_channel_dataset": "sagemaker_dist.runtime.tensorflow.data.file_dataset",
    "TensorBoardSyncer": "sagemaker_dist.runtime.tensorboard_sync",
    # PyTorch DDP under torchrun (PyTorch loads when these are used, not when they are imported)
    "setup_ddp": "sagemaker_dist.runtime.torch.process_group",
    "DdpJob": "sagemaker_dist.runtime.torch.process_group",
    "ddp_main": "sagemaker_dist.runtime.torch.process_group",
    "PipeBatches": "sagemaker_dist.runtime.torch.batches",
    "RecordBatches": "sagemaker_dist.runtime.torch.record_batches",
    "RaggedBatch": "sagemaker_dist.runtime.torch.batch_cutter",
    "decode_jpeg_batch": "sagemaker_dist.runtime.torch.images",
    "ImageDecodeError": "sagemaker_dist.runtime.torch.images",
    "agreed_batches": "sagemaker_dist.runtime.torch.epochs",
    "PipeTraining": "sagemaker_dist.runtime.torch.training",
    "save_torch_checkpoint": "sagemaker_dist.runtime.torch.checkpointing",
    "restore_torch_checkpoint": "sagemaker_dist.runtime.torch.checkpointing",
    "ShardedCheckpoints": "sagemaker_dist.runtime.torch.sharded",
    "read_sharded_checkpoint": "sagemaker_dist.runtime.torch.sharded",
    "parse_example": "sagemaker_dist.runtime.torch.records",
    "example_decoder": "sagemaker_dist.runtime.torch.records",
    "raw_decoder": "sagemaker_dist.runtime.torch.records",
    "ExampleParseError": "sagemaker_dist.runtime.torch.records",
    # WebDataset samples (record_format="WebDataset"): a record is one sample's tar members
    "parse_sample": "sagemaker_dist.runtime.framing.tar",
    "tar_records": "sagemaker_dist.runtime.framing.stream",
    "sample_decoder": "sagemaker_dist.runtime.torch.samples",
    "SampleDecodeError": "sagemaker_dist.runtime.torch.samples",
}
# modules reachable as attributes (``from sagemaker_dist.runtime import horovod_keras``) -> where they are
_SUBMODULES = {
    "horovod_keras": "sagemaker_dist.runtime.tensorflow.horovod_keras",
    "mwms_keras": "sagemaker_dist.runtime.tensorflow.mwms_keras",
    "checkpoints": "sagemaker_dist.runtime.checkpoints",
    "tensorboard_sync": "sagemaker_dist.runtime.tensorboard_sync",
}

__all__ = sorted(_LAZY) + list(_SUBMODULES)


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(_SUBMODULES[name])
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES))
