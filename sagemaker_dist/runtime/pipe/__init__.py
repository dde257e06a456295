"""PipeModeDataset: a tf.data.Dataset over a SageMaker Pipe-mode channel, for any TF 2.x.

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

- ``dataset``: ``PipeModeDataset`` and ``rank_dataset`` (argument and channel checks);
- ``native_build``: which reader runs; builds, caches and loads the compiled one;
- ``compiled``: the dataset on the compiled reader;
- ``epochs``: the per-channel epoch counter (which FIFO the next iteration opens);
- ``reader``: the reader thread (FIFO -> framed chunks);
- ``tf_bridge``: chunks into tf.data without a copy, (re)batched in C++.

Scripts import the public names from ``sagemaker_dist.runtime``.
"""
