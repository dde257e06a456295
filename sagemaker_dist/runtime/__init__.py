"""Inside the training container: rank -> channel -> FIFO, records as tf.data, Horovod helpers.

Never imports the SageMaker SDK. TensorFlow is imported only when a TF-backed name is first used
(PEP 562), so ``import sagemaker_dist.runtime`` and the config/rank checks stay cheap.
"""

from __future__ import annotations

import importlib

# public name -> module that defines it
_LAZY = {
    "PipeModeDataset": "sagemaker_dist.runtime.pipe.dataset",
    "PipeModeDatasetError": "sagemaker_dist.runtime.pipe.dataset",
    "PipeModeDatasetException": "sagemaker_dist.runtime.pipe.dataset",  # AWS's name for the same class
    "rank_dataset": "sagemaker_dist.runtime.pipe.dataset",
    "ContainerConfig": "sagemaker_dist.runtime.config",
    "RankInfo": "sagemaker_dist.runtime.ranks",
    "RankChannelError": "sagemaker_dist.runtime.ranks",
    "check_rank_channels": "sagemaker_dist.runtime.ranks",
    "RecordFormatError": "sagemaker_dist.runtime.framing.base",
    "ShuffleWindow": "sagemaker_dist.runtime.framing.shuffle",
    "ReaderStateError": "sagemaker_dist.runtime.pipe.order",
    "file_channel_dataset": "sagemaker_dist.runtime.keras.file_dataset",
    "TensorBoardSyncer": "sagemaker_dist.runtime.tensorboard_sync",
    # PyTorch DDP under torchrun (PyTorch loads when these are used, not when they are imported)
    "setup_ddp": "sagemaker_dist.runtime.torch.process_group",
    "DdpJob": "sagemaker_dist.runtime.torch.process_group",
    "ddp_main": "sagemaker_dist.runtime.torch.process_group",
    "PipeBatches": "sagemaker_dist.runtime.torch.batches",
    "RecordBatches": "sagemaker_dist.runtime.torch.record_batches",
    "RaggedBatch": "sagemaker_dist.runtime.torch.record_batches",
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
# submodules reachable as attributes (``from sagemaker_dist.runtime import horovod_keras``)
_SUBMODULES = ("horovod_keras", "checkpoints", "tensorboard_sync")

__all__ = sorted(_LAZY) + list(_SUBMODULES)


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES))
