"""PyTorch DDP under ``torchrun`` over the same per-rank Pipe-mode channels, one concern a file.

- ``process_group``: ``setup_ddp()`` checks this rank's channel (before any collective), claims its
  FIFO, starts the process group from torchrun's environment (NCCL on GPUs, Gloo on CPU) and returns
  the ``DdpJob``; ``ddp_main`` names the failing rank with its traceback;
- ``batches``: ``PipeBatches``, the rank's channel as batches of tensors from a reader thread;
- ``record_batches``: ``RecordBatches``, the same channel as batches of raw records framed in compiled
  code straight into (pinned) uint8 tensors: ``[n, record_bytes]``, or a ``RaggedBatch`` of offsets;
  ``batch_buffers`` the memory they live in, ``batch_cutter`` a shuffled epoch cut into them;
- ``images``: ``decode_jpeg_batch``, a ragged batch of JPEG records decoded at once on the GPU
  (nvJPEG through torchvision), or on the CPU where no GPU is;
- ``epochs``: ``agreed_batches``, epochs that end on the same step on every rank (no record counts);
- ``stop``: SIGTERM (a stop, a spot interruption) as a request the ranks agree on at a step;
- ``checkpointing``: rank-0 checkpoints of model, optimizer, scheduler, epoch and step, restored on
  rank 0 and broadcast;
- ``training``: ``PipeTraining``, the loop's epochs, batches, resume, stop and metric lines together;
- ``records``: raw records and ``tf.train.Example`` records decoded without TensorFlow.

Importing this package loads nothing; PyTorch loads when a name that needs it is used. Scripts import
the public names from ``sagemaker_dist.runtime``.
"""
