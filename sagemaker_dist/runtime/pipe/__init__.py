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

- ``dataset``: ``PipeModeDataset`` and ``rank_dataset`` (argument and channel checks);
- ``epochs``: the per-channel epoch counter (which FIFO the next iteration opens);
- ``reader``: the reader thread (FIFO -> framed chunks);
- ``tf_bridge``: chunks into tf.data without a copy, (re)batched in C++.

Scripts import the public names from ``sagemaker_dist.runtime``.
"""
