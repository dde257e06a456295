"""The epoch reader every framework's side reads a Pipe-mode channel with: one FIFO ``<channel>_<n>`` per
epoch, framed into chunks of records by a thread ahead of the training loop. Imports no framework:
TensorFlow's datasets (``tensorflow/data/``) and PyTorch's batches (``torch/``) stand on it.

- ``reader``: the reader thread (a FIFO -> framed chunks, read ahead);
- ``epochs``: the per-channel epoch counter (which FIFO the next iteration opens);
- ``order``: a reader's place in its channel: the epoch base, the stream's head, and the FIFOs a resumed
  job opens and closes unread.
"""
