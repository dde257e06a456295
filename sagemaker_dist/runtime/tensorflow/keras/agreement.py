"""Epochs that end together without record counts: every step, each rank says whether it has a batch
and the ranks agree (a min-allreduce of that flag); the epoch ends on every rank at the first step
where some rank has none, as tf.distribute's distributed iterators do for MultiWorkerMirroredStrategy.

The policy is "shortest": the records other ranks still hold are not trained on this epoch, but
reported (the batch each had read ahead; the rest of its FIFO is closed unread, so SageMaker opens the
next epoch's FIFO). A rank whose FIFO delivers nothing ends the epoch for all at its first step.
"""

from __future__ import annotations

import logging

from sagemaker_dist.runtime.tensorflow.keras.steps import blank_like
from sagemaker_dist.runtime.training_session import EpochReport

log = logging.getLogger(__name__)


class EpochReports:
    """The reports of one role's epochs, in order; ``on_report`` gets each as it happens."""

    def __init__(self, what: str, rank: int):
        self.what, self.rank = what, rank
        self.reports: list[EpochReport] = []

    def add(self, steps, gathered) -> None:
        rows = gathered.reshape(-1, 3)
        report = EpochReport(
            self.what,
            int(steps),
            tuple(int(r[0]) for r in rows),
            tuple(int(r[1]) for r in rows),
            tuple(i for i, r in enumerate(rows) if not r[2]),
        )
        self.reports.append(report)
        if self.rank == 0:
            print(report.line(), flush=True)  # the job's log: every epoch says where it ended and why


def _records_in(batch):
    """Records in one element: the first tensor's batch dimension (1 for unbatched records)."""
    import tensorflow as tf

    first = tf.nest.flatten(batch)[0]
    return tf.cast(tf.shape(first)[0] if first.shape.rank else 1, tf.int64)


AGREED = "_sagemaker_dist_agreed_epochs"  # marks a dataset whose epochs end by agreement


def keras2_data_handler():
    """Keras 2's ``DataHandler`` (keras's or tf_keras's, whichever is behind ``tf.keras``)."""
    import importlib

    import tensorflow as tf

    engine = tf.keras.Model.__module__.rsplit(".", 1)[0]  # keras.src.engine, or tf_keras's
    return importlib.import_module(f"{engine}.data_adapter").DataHandler


def keras2_epochs_of_any_length(original):
    """Keras 2 takes the first epoch's step count as every epoch's and stops training ("Your input ran
    out of data") when a later epoch is shorter. An agreed epoch may be shorter or longer: for datasets
    marked ``AGREED``, ``DataHandler.enumerate_epochs`` forgets the count at each epoch's start, so
    every epoch runs until the workers agree it has ended (``patches.py`` installs it during a fit).
    Under a strategy ``_dataset`` is the distributed dataset; the mark is on the adapter's."""

    def enumerate_epochs(self):
        agreed = any(getattr(d, AGREED, False) for d in (self._dataset, self._adapter.get_dataset()))
        for epoch, iterator in original(self):
            if agreed:
                self._inferred_steps = None
                EPOCH_ITERATOR.current = iterator
            yield epoch, iterator

    return enumerate_epochs


def agreed(epoch_iterator) -> bool:
    """Whether a Keras 3 epoch iterator runs over a dataset marked ``AGREED``."""
    return getattr(getattr(getattr(epoch_iterator, "data_adapter", None), "_dataset", None), AGREED, False)


def keras3_epochs_of_any_length(original):
    """Keras 3 also cuts a longer epoch short: ``EpochIterator._enumerate_iterator`` forgets the
    count at each epoch's start for datasets marked ``AGREED`` (``patches.py`` installs it)."""

    def _enumerate_iterator(self):
        if not agreed(self):
            yield from original(self)
            return
        self._num_batches = None
        for begin, end, iterator in original(self):
            EPOCH_ITERATOR.current = iterator
            yield begin, end, iterator

    return _enumerate_iterator


class AgreedEpochIterator:
    """The iterator of the agreed epoch a fit is in (the Keras patches note it), so a stop agreed after
    a step can tell whether that step was the epoch's last without a collective of its own."""

    def __init__(self):
        self.current = None

    def has_more(self) -> bool | None:
        """Whether the epoch has another step, by reading it (the fit is stopping: nothing is lost);
        None when no agreed epoch runs. Under a strategy ``get_next_as_optional`` is itself the
        workers' agreement, so every worker must call it at the same step."""
        if self.current is None:
            return None
        return bool(self.current.get_next_as_optional().has_value())


EPOCH_ITERATOR = AgreedEpochIterator()


def agreed_epoch(batches, what: str, hvd, reports: EpochReports, stop=None):
    """``batches`` ended at the step where the first rank runs out, the same step on every rank.

    With ``stop`` (a ``stop.StopRequest``), the same allreduce also carries each rank's stop request
    (min of ``[has, -wants]``): once any rank wants to stop, every rank trains that step and ends there,
    its records per rank noted in ``stop.agreed``, with no collective after it."""
    import tensorflow as tf

    blank = blank_like(batches.element_spec)

    def has_batch(*b):
        return tf.constant(1, tf.int64), (b if len(b) > 1 else b[0])

    def agreed_to_go_on(everyone, batch):
        return everyone > 0

    def the_batch(everyone, batch):
        return batch

    flagged = batches.map(has_batch)
    out_of_data = tf.data.Dataset.from_tensors((tf.constant(0, tf.int64), blank)).repeat()
    padded = flagged.concatenate(out_of_data)
    zero = tf.constant(0, tf.int64)

    def agree(has):
        if stop is None:
            return hvd.allreduce(has, op=hvd.Min, name=f"sagemaker_dist_{what}_has_batch"), zero
        wants = tf.reshape(tf.py_function(stop.wanted, [], tf.int64), [])
        both = hvd.allreduce(tf.stack([has, -wants]), op=hvd.Min, name=f"sagemaker_dist_{what}_has_or_stop")
        return both[0], -both[1]

    def after_stop(has):
        more = hvd.allreduce(has, op=hvd.Min, name=f"sagemaker_dist_{what}_has_batch_after_stop")
        noted = tf.py_function(lambda m: stop.note_rest(int(m.numpy()) > 0) or 0, [more], tf.int64)
        with tf.control_dependencies([noted]):
            return tf.identity(zero), tf.identity(zero)

    def step(state, item):
        steps, read, stopped = state
        has, batch = item
        # after the agreed stop: end here; one last has-only allreduce (every rank is at the same place)
        # says whether the stopped step was the epoch's last, so the checkpoint can say "epoch done"
        everyone, stopping = tf.cond(stopped > 0, lambda: after_stop(has), lambda: agree(has))
        records = _records_in(batch) * has

        def report():  # every rank takes this branch at the same step: the allgather is safe
            mine = tf.stack([read, records, has])
            gathered = hvd.allgather(tf.expand_dims(mine, 0), name=f"sagemaker_dist_{what}_epoch_end")
            return tf.py_function(_add_report, [steps, gathered], tf.int64)

        def _add_report(steps_done, gathered):
            reports.add(steps_done.numpy(), gathered.numpy())
            return 0

        def note_stop():  # the same on every rank: the stop was agreed at this step
            trained = tf.expand_dims(tf.reshape(read + records, [1]), 0)
            gathered = hvd.allgather(trained, name=f"sagemaker_dist_{what}_stop_records")
            return tf.py_function(_note_stop, [steps, gathered], tf.int64)

        def _note_stop(index, gathered):
            stop.note_agreed(index.numpy(), gathered.numpy().reshape(-1))
            return 0

        ended = tf.cond(tf.logical_and(everyone <= 0, stopped <= 0), report, lambda: tf.constant(0, tf.int64))
        stop_now = everyone * stopping
        noted = tf.cond(stop_now > 0, note_stop, lambda: tf.constant(0, tf.int64)) if stop else zero
        with tf.control_dependencies([ended, noted]):
            state = (steps + everyone, read + records * everyone, stop_now)
        return state, (everyone, batch)

    agreed = padded.scan((zero, zero, zero), step)
    # prefetch: the next step's agreement runs while this step trains (every rank still submits the
    # same collectives in the same order, and nothing is read past the agreed end)
    epoch = agreed.take_while(agreed_to_go_on).map(the_batch).prefetch(1)
    setattr(epoch, AGREED, True)
    return epoch
