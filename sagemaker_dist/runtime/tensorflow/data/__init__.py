"""The channels as tf.data datasets: PipeModeDataset over a SageMaker Pipe-mode channel, for any TF 2.x,
and a File-mode channel's records.

Drop-in for ``sagemaker_tensorflow.PipeModeDataset`` (same constructor), built on tf.data with one
traced function. A Python thread per iteration reads the FIFO ahead of TensorFlow, frames the
records (TFRecord's lengths and CRCs in C where the extension is built) and makes them into
tensors itself: small records as one string per chunk cut up by ``tf.strings.substr``, large
TFRecords read one by one straight into their own ``bytes`` and grouped in whole batches, so
``.batch(n)`` (a rebatch) passes them through without a copy. TensorFlow takes each chunk through
``py_function``, without a copy. Every new iteration (epoch, ``.repeat()``, Keras
``fit(epochs=...)``) closes the one before and opens the next FIFO ``<channel>_<n>``; ``n`` is kept
in ``<state_dir>/<channel>`` under flock, as AWS does.

Where a C++ compiler is, the reader is compiled instead (``native/pipe_dataset_op.cc``): a tf.data
source op built at first use against the installed TensorFlow, same files, same errors, same tests.

- ``pipe_dataset``: ``PipeModeDataset`` and ``rank_dataset`` (argument and channel checks);
- ``native_build``: which reader runs; builds, caches and loads the compiled one (``native/``: its source);
- ``compiled_dataset``: the dataset on the compiled reader;
- ``tf_bridge``: the core's epoch reader (``runtime/epoch_reader/``: FIFO -> framed chunks) into tf.data
  without a copy, (re)batched in C++;
- ``file_dataset``: a File-mode channel (every rank reads all of it) as a tf.data.Dataset.

Scripts import the public names from ``sagemaker_dist.runtime``.
"""
